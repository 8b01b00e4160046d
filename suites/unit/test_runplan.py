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
from pathlib import Path

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
        "platform": None, "ray_address": None, "worker_logs": False, "cuda_graphs": None, "decode_kernels": None,
        "grouped_fp32": None, "collective_timeout_s": None}
    back = read_plan(doc, source="r/run.json")
    assert back.workload == run_plan.workload and back.topology == run_plan.topology
    assert read_plan(doc, source="r/run.json", ray_address="10.0.0.1:6379").ray_address == "10.0.0.1:6379"
    doc["plan_options"]["ray_address"] = "10.0.0.1:6379"  # recorded, never followed: a resume asks again
    assert read_plan(doc, source="r/run.json").ray_address is None
    doc["topology"]["policy"]["groups"]["tp"] = [[0], [1]]
    with pytest.raises(SpecError) as exc:
        read_plan(doc, source="r/run.json")
    assert exc.value.field == "topology" and "r/run.json#/topology" in str(exc.value)


def test_run_options_are_plan_fields_that_resume_as_they_ran_and_cross_to_workers_set(monkeypatch):
    from harness.runner.run import worker_env

    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    monkeypatch.setenv("HARNESS_NATIVE_CUDA_GRAPHS", "1")  # the driver's own environment decides nothing
    run_plan = build_plan(SMOKE, options=["cuda_graphs=off", "collective_timeout_s=3600", "worker_logs=true"],
                          runnable=False)
    opts = run_plan.options
    assert (opts.cuda_graphs, opts.collective_timeout_s, opts.worker_logs, opts.grouped_fp32) == (False, 3600.0,
                                                                                                   True, None)
    env = worker_env(run_plan.workload, Path("/r"), "rid", opts)
    assert env["HARNESS_NATIVE_CUDA_GRAPHS"] == "0" and env["HARNESS_COLLECTIVE_TIMEOUT_S"] == "3600.0"
    assert env["HARNESS_GROUPED_FP32"] == "" and env["HARNESS_NATIVE_DECODE_KERNELS"] == ""  # "": the default
    assert "GOLDEN_WORKER_LOGS" not in env  # the driver's switch: no carrier
    default = worker_env(run_plan.workload, Path("/r"), "rid", build_plan(SMOKE, runnable=False).options)
    assert default["HARNESS_NATIVE_CUDA_GRAPHS"] == ""  # the plan's default, not the inherited "1"
    doc = json.loads(json.dumps(write_plan({"run_id": "x"}, run_plan)))
    assert read_plan(doc, source="r/run.json").options == opts  # a resume runs with the same switches
    doc["plan_options"]["decode_kernels"] = "quick"
    with pytest.raises(SpecError, match=r"options.decode_kernels: must be one of standard, invariant"):
        read_plan(doc, source="r/run.json")


@pytest.mark.parametrize(("pair", "field", "message"), [
    ("cuda_graphs=maybe", "options.cuda_graphs", "must be true or false"),
    ("collective_timeout_s=-1", "options.collective_timeout_s", "must be a number of seconds > 0"),
    ("decode_kernels=quick", "options.decode_kernels", "must be one of standard, invariant"),
    ("graphs=1", "options.graphs", "unknown run option"),
    ("cuda_graphs", "options", "is not FIELD=VALUE"),
])
def test_a_bad_run_option_is_refused_by_golden_plan_with_exit_2(pair, field, message, capsys):
    assert main(["plan", SMOKE, "--option", pair]) == 2
    err = capsys.readouterr().err
    assert f"{field}: " in err and message in err and "Traceback" not in err


def test_a_carrier_of_a_run_option_in_plugins_env_is_refused(monkeypatch):
    with pytest.raises(SpecError) as exc:
        build_plan(SMOKE, ['plugins.env.HARNESS_GROUPED_FP32="0"'], runnable=False)
    assert exc.value.field == "plugins.env.HARNESS_GROUPED_FP32" and "--option grouped_fp32=" in str(exc.value)


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
