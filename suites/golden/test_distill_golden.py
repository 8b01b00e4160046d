"""The distillation golden catches a teacher whose logits are wrong.

A run of ``qwen3_moe_tiny_distill`` whose teacher TP rank 1 writes its vocab shard
of the logits 0.5 too high at one entry (``harness.mutations.teacher_logits_planted_wrong``,
a worker setup hook: the teacher's own forward, operators and collectives are
unchanged; only the values the student reads through the IPC buffers move) is
compared with the stored golden ``goldens/qwen3_moe_tiny_distill/cpu``: the gate
must fail on the training surface in step 1, on the student's ``distill_kl`` and
``loss``, and the teacher ranks' own inventories of step 1 must stay equal.

The run goes through the ``golden`` fixture's warm runtime, like the planted
regressions of ``test_mutations.py`` (the mutation is ``WARM_SAFE``): the student's
policy and rollout processes come from the pool, run the hook before they adopt
the workload and undo it after (``WarmRuntime.release``); the teacher's ranks are
fresh processes forked from the runtime's zygote, which runs the hook in them before
their worker starts (``zygote.HOOK_VAR``), as Ray runs a cold run's hook. That the
hook took in the teacher is the training finding itself (only a teacher rank's
buffer moves). Nothing is left behind: the pool processes are pooled again only
after their undo (checked here), and the test shares its xdist group with the
distillation golden's tests, so the clean golden run comes after it in the same
processes and must equal the cold golden (``test_goldens.py``).
"""

from __future__ import annotations

import pytest

from harness import flows
from suites.stored_goldens import stored_dir

WORKLOAD = "qwen3_moe_tiny_distill"

pytestmark = [pytest.mark.slow, pytest.mark.golden, pytest.mark.xdist_group(WORKLOAD),
              pytest.mark.golden_uses(WORKLOAD, files=("harness/mutations.py", "suites/stored_goldens.py"))]


def test_planted_teacher_logits_fail_the_distillation_golden(golden, tmp_path, monkeypatch):
    runtime = golden.warm_runtime()
    before = runtime.stats() if runtime is not None else None
    monkeypatch.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.teacher_logits_planted_wrong")
    execution = flows.execute(WORKLOAD, run_dir=tmp_path / "run", platform="cpu", warm=runtime)
    assert execution.ok, execution.problems()
    verdict = flows.compare_with_golden(execution, stored_dir(WORKLOAD).name)
    assert not verdict.ok
    failed = [f for f in verdict.findings if f.status in ("fail", "stale")]
    step1 = {f.key.rsplit("/", 1)[-1] for f in failed if f.surface == "training" and f.section == "step0001"}
    assert {"distill_kl", "loss"} <= step1, step1
    teacher_step1 = [f for f in failed if f.surface in ("operators", "collectives", "lifecycle")
                     and (f.section or "").startswith("teacher/") and f.phase == "teacher/step1"]
    assert not teacher_step1, teacher_step1
    if runtime is not None:  # every pool process that ran the hook undid it and went back to the pool
        after = runtime.stats()
        assert after["tainted_killed"] == before["tainted_killed"], (before, after)
        assert after["hooks_undone"] - before["hooks_undone"] >= 3, (before, after)  # 2 student ranks, 1 engine
