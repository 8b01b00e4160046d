"""harness.spec.runplan: a run worked out once (issue 42).

* ``build_plan`` reads the workload file once, validates the spec once and checks the
  layout rules once, also when the platform moves the device (main read and validated
  the file twice and checked the layout four times per ``golden run``);
* ``write_plan`` / ``read_plan`` round-trip through run.json's JSON, and a stored
  topology that disagrees with its spec is refused;
* every case of the issue is refused by ``golden plan`` with exit 2 naming the field and
  the rule, and by ``golden run`` before a run directory is written.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

import harness.spec.constraints as constraints_mod
import harness.spec.load as load_mod
import harness.spec.topology as topology_mod
import harness.spec.yaml_io as yaml_mod
from harness.cli import main
from harness.spec.errors import SpecError
from harness.spec.runplan import RunPlan, build_plan, read_plan, write_plan

SMOKE = "qwen3_moe_tiny_smoke"
FLAGSHIP = "qwen3_moe_tiny_tp2pp2cp2ep2"


@pytest.fixture
def counted(monkeypatch):
    """Count the steps of working a plan out (wrapping the module functions ``build_plan``
    reaches where each caller looks them up)."""
    counts: Counter[str] = Counter()

    def wrap(module, name):
        real = getattr(module, name)

        def counting(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)

    wrap(yaml_mod, "load_yaml_file")
    wrap(load_mod, "spec_from_dict")
    wrap(topology_mod, "check_spec")  # topology.plan's (a module-level import)
    wrap(constraints_mod, "check_spec")  # load.spec_from_dict's (imported at call time)
    return counts


def test_the_file_is_read_once_and_the_layout_checked_once(counted, monkeypatch):
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    run_plan = build_plan(SMOKE, ["policy.tp=2", "policy.sp=true"], runnable=False)
    assert isinstance(run_plan, RunPlan)
    assert counted == {"load_yaml_file": 1, "spec_from_dict": 1, "check_spec": 1}
    assert run_plan.topology.policy.world == 2 and run_plan.workload.policy.tp == 2
    counted.clear()
    cuda = build_plan(SMOKE, platform="cuda", runnable=False, packages=False)  # the device moved: one read still
    assert cuda.workload.platform.device == "cuda" and cuda.options.platform == "cuda"
    assert counted["load_yaml_file"] == 1 and counted["check_spec"] == 1


def test_the_plan_round_trips_through_run_json_and_a_changed_topology_is_refused(monkeypatch):
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    run_plan = build_plan(FLAGSHIP, runnable=False)
    doc = json.loads(json.dumps(write_plan({"run_id": "x"}, run_plan), sort_keys=True))
    assert doc["run_id"] == "x" and doc["workload"] == FLAGSHIP and doc["plan_options"] == {
        "platform": None, "ray_address": None}
    back = read_plan(doc, source="r/run.json")
    assert back.workload == run_plan.workload and back.topology == run_plan.topology
    assert read_plan(doc, source="r/run.json", ray_address="10.0.0.1:6379").ray_address == "10.0.0.1:6379"
    doc["plan_options"]["ray_address"] = "10.0.0.1:6379"  # recorded, never followed: a resume asks again
    assert read_plan(doc, source="r/run.json").ray_address is None
    doc["topology"]["policy"]["groups"]["tp"] = [[0], [1]]
    with pytest.raises(SpecError) as exc:
        read_plan(doc, source="r/run.json")
    assert exc.value.field == "topology" and "r/run.json#/topology" in str(exc.value)


CASES = [  # (workload, overrides, field, rule)
    (SMOKE, ["policy.tp=4", "policy.sp=true"], "policy.tp", "model.kv_heads % policy.tp == 0"),
    (SMOKE, ["policy.tp=2", "policy.sp=true", "policy.etp=2"], "policy.etp", "policy.etp == 1"),
    (SMOKE, ["rollout.max_new_tokens=1000"], "rollout.max_new_tokens", "rollout.max_new_tokens < policy.seq_len"),
    (SMOKE, ["seed=1180591620717411303424"], "seed", "seed * 1000 + policy_world < 2**63"),
    (FLAGSHIP, ["policy.etp=2"], "policy.etp", "policy.etp == 1"),
    (FLAGSHIP, ["policy.tp=4", "policy.cp=1"], "policy.tp", "model.kv_heads % policy.tp == 0"),
]


@pytest.mark.parametrize(("workload", "overrides", "field", "rule"), CASES)
def test_every_case_of_the_issue_is_refused_by_the_plan(workload, overrides, field, rule, capsys, tmp_path):
    with pytest.raises(SpecError) as exc:
        build_plan(workload, overrides, runnable=False)
    assert exc.value.field == field and getattr(exc.value, "rule", None) == rule
    assert main(["plan", workload, *overrides]) == 2
    err = capsys.readouterr().err
    assert f"{field}:" in err and f"[rule: {rule}]" in err
    run_dir = tmp_path / "run"
    assert main(["run", workload, *overrides, "--run-dir", str(run_dir), "-q"]) == 2
    assert not (run_dir / "run.json").exists()  # refused before the run started


@pytest.mark.parametrize("override", ["model.layers=100000000", "grpo.prompts_per_step=1000000000"])
def test_a_run_the_machine_cannot_hold_is_refused_by_the_plan(override, monkeypatch):
    from harness.spec import resources

    # a double for /proc/meminfo only: the refusal must not depend on the box the test runs on
    monkeypatch.setattr(resources, "machine_memory_bytes", lambda path=resources.MEMINFO: 24 << 30)
    with pytest.raises(SpecError) as exc:
        build_plan(SMOKE, [override], runnable=False)
    assert exc.value.field == override.split("=")[0] and "GiB" in exc.value.message
