"""The warm pool's contracts below a whole workload (``harness.runner.warm``, ``process_state``).

* ``ProcessBaseline.restore`` undoes what a workload changes process-wide
  (environment, RNGs, thread count, deterministic mode) and applies the next
  workload's environment.
* ``cold_reason`` / ``private_ray_reason``: which specs may adopt warm processes.
* A real 1-rank ``PolicyGroup`` over Ray: a clean shutdown hands the process
  back and the next group adopts the same pid, with the same freshly seeded
  weights; a group whose call failed kills its processes instead of pooling them;
  a group that ran a setup hook (a planted regression) has it undone and is
  pooled again, and the next group gets the clean weights in that process.
* ``run_setup_hook`` names a hook that does not resolve.
* ``harness.mutations.undo`` puts back every attribute each ``WARM_SAFE``
  mutation replaced (the very objects), also after two mutations stacked.
"""

from __future__ import annotations

import os
import random
import time

import pytest
import torch

from harness.runner.process_state import ProcessBaseline, process_start_time
from harness.runner.warm import cold_reason, private_ray_reason
from harness.spec import load_spec
from harness.spec.load import default_goldens_root
from harness.spec.topology import plan
from harness.spec.typed import as_workload
from suites.torch_state import torch_settings

SMOKE = default_goldens_root() / "qwen3_moe_tiny_smoke" / "workload.yaml"


def test_restore_undoes_process_wide_changes(monkeypatch):
    monkeypatch.setenv("HARNESS_TRACE_DIR", "/tmp/before")  # monkeypatch restores the real env afterwards
    with torch_settings(threads=1, deterministic=False):
        baseline = ProcessBaseline.capture()
        expected_draw = torch.rand(3)
        torch.set_rng_state(baseline.torch_rng)
        # a "workload" changes everything it can
        os.environ["HARNESS_TRACE_DIR"] = "/tmp/previous-run"
        os.environ["NRL_POLICY_PROFILER_CLASS"] = "some.Profiler"
        torch.manual_seed(99)
        random.seed(99)
        torch.set_num_threads(2)
        torch.use_deterministic_algorithms(True)
        baseline.restore({"HARNESS_RUN_ID": "next"})
        assert os.environ["HARNESS_TRACE_DIR"] == "/tmp/before"
        assert "NRL_POLICY_PROFILER_CLASS" not in os.environ
        assert os.environ["HARNESS_RUN_ID"] == "next"
        assert torch.equal(torch.rand(3), expected_draw)
        assert random.getstate() == baseline.py_rng
        assert torch.get_num_threads() == 1
        assert not torch.are_deterministic_algorithms_enabled()


def test_a_setup_hook_that_does_not_resolve_is_named():
    from harness.runner.process_state import run_setup_hook

    with pytest.raises(ValueError, match="harness.mutations.no_such_hook"):
        run_setup_hook("harness.mutations.no_such_hook")
    with pytest.raises(ValueError, match="no_module_here.f"):
        run_setup_hook("no_module_here.f")


def test_every_warm_safe_mutation_is_undone_exactly():
    import harness.distill.teacher as teacher
    import harness.mutations as mutations
    import harness.parallel.data as data
    import harness.parallel.groups as groups
    import harness.parallel.tensor as tensor
    from harness.rollout.engine_procs import EngineProcesses
    from harness.rollout.engine_worker import EngineWorker

    owners = (tensor, data, groups.ProcessGroups, EngineProcesses, EngineWorker, teacher)
    before = [dict(vars(o)) for o in owners]
    for name in sorted(mutations.WARM_SAFE):
        getattr(mutations, name)()
        assert [dict(vars(o)) for o in owners] != before, f"{name} patched nothing here"
        if name == "extra_operator":  # stack a second one on top before undoing both
            mutations.extra_tp_collective()
        assert mutations.undo() >= 1
        after = [dict(vars(o)) for o in owners]
        for owner, old, new in zip(owners, before, after):
            assert old.keys() == new.keys(), (name, owner)
            assert all(new[k] is old[k] for k in old if k != "__dict__"), (name, owner)
    assert mutations.undo() == 0


def test_process_start_time_is_in_the_past():
    started = process_start_time()
    assert started is not None and 0 < started <= time.time()


def test_which_specs_run_warm():
    spec = load_spec(str(SMOKE))
    assert cold_reason(spec, environ={}) is None
    mutation = {"GOLDEN_WORKER_SETUP_HOOK": "harness.mutations.extra_operator"}
    assert cold_reason(spec, environ=mutation) is None  # planted regressions run warm (then killed)
    for other in ("suites.faults.planted.stage_returns_before_commit",  # not harness.mutations
                  "harness.mutations.policy_rank1_dies_in_step2"):  # patches an actor class: not WARM_SAFE
        assert "GOLDEN_WORKER_SETUP_HOOK" in cold_reason(spec, environ={"GOLDEN_WORKER_SETUP_HOOK": other})
        assert "GOLDEN_WORKER_SETUP_HOOK" in private_ray_reason(spec, environ={"GOLDEN_WORKER_SETUP_HOOK": other})
    megatron = as_workload({**spec, "policy": {**spec["policy"], "backend": "megatron"}})
    assert "megatron" in cold_reason(megatron, environ={})
    assert private_ray_reason(megatron, environ={}) is None  # fresh processes, shared Ray
    # fresh processes would not run the hook: a private Ray applies it to every worker
    assert "megatron" in private_ray_reason(megatron, environ=mutation)
    assert "GOLDEN_WORKER_ENV" in private_ray_reason(spec, environ={**mutation, "GOLDEN_WORKER_ENV": "auto"})
    # a distillation teacher's fresh ranks run the hook when forked from the zygote, so only without one
    # does a planted teacher regression need a private Ray
    distill = load_spec(str(default_goldens_root() / "qwen3_moe_tiny_distill" / "workload.yaml"))
    teacher = {"GOLDEN_WORKER_SETUP_HOOK": "harness.mutations.teacher_logits_planted_wrong"}
    assert cold_reason(distill, environ=teacher) is None
    assert "GOLDEN_ZYGOTE=0" in private_ray_reason(distill, environ={**teacher, "GOLDEN_ZYGOTE": "0"})
    assert private_ray_reason(distill, environ={"GOLDEN_ZYGOTE": "0"}) is None
    cuda = as_workload({**spec, "platform": {**spec["platform"], "device": "cuda"}})
    assert "cuda" in private_ray_reason(cuda, environ={})


@pytest.mark.slow
def test_policy_processes_are_reused_only_after_a_clean_shutdown(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    from harness.policy.group import PolicyGroup
    from harness.policy.synthetic import synthetic_batch
    from harness.runner.warm import WarmRuntime
    from harness.spec.typed import as_workload

    spec = load_spec(str(SMOKE)).to_dict()
    spec["plugins"] = {**spec["plugins"], "policy_profiler": None}
    topology = plan(spec)
    runtime = WarmRuntime()
    try:
        runtime.ensure_ray()

        def group(name: str) -> PolicyGroup:
            return PolicyGroup(as_workload(spec), topology, str(tmp_path / name), env_vars={"HARNESS_RUN_ID": name},
                               pool=runtime)

        first = group("a")
        pid, sums = first.ready_info[0]["pid"], first.parameter_checksums()
        first.train(synthetic_batch(spec, 4, seed=0))
        assert first.parameter_checksums() != sums  # the step moved the weights the process holds
        first.shutdown()
        assert runtime.idle() == {"policy": 1, "rollout": 0}
        second = group("b")
        assert second.ready_info[0]["pid"] == pid  # the warm process was adopted again
        assert second.parameter_checksums() == sums  # fresh model from the same seeds, not the old one
        with pytest.raises(RuntimeError, match=r"policy worker 0 \(rank 0.*failed during load_checkpoint"):
            second.load_checkpoint(str(tmp_path / "no-such-checkpoint"))
        second.shutdown()
        assert runtime.idle() == {"policy": 0, "rollout": 0}  # a failed group's process is killed
        third = group("c")
        assert third.ready_info[0]["pid"] != pid
        third.shutdown()
        monkeypatch.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.extra_operator")
        mutated = group("m")
        mutated_pid = mutated.ready_info[0]["pid"]
        mutated.shutdown()
        assert runtime.stats()["hooks_undone"] == 1 and runtime.stats()["tainted_killed"] == 0
        assert runtime.idle() == {"policy": 1, "rollout": 0}  # undone, pooled again
        monkeypatch.delenv("GOLDEN_WORKER_SETUP_HOOK")
        clean = group("d")
        assert clean.ready_info[0]["pid"] == mutated_pid
        assert clean.parameter_checksums() == sums
        clean.shutdown()
    finally:
        runtime.close()
