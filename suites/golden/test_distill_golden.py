"""The distillation golden catches a teacher whose logits are wrong.

A run of ``qwen3_moe_tiny_distill`` whose teacher TP rank 1 writes its vocab shard
of the logits 0.5 too high at one entry (``harness.mutations.teacher_logits_planted_wrong``,
a worker setup hook: the teacher's own forward, operators and collectives are
unchanged; only the values the student reads through the IPC buffers move) is
compared with the stored golden ``goldens/qwen3_moe_tiny_distill/cpu``: the gate
must fail on the training surface in step 1, on the student's ``distill_kl`` and
``loss``, and the teacher ranks' own inventories of step 1 must stay equal.
"""

from __future__ import annotations

import pytest

from harness import flows

WORKLOAD = "qwen3_moe_tiny_distill"

pytestmark = [pytest.mark.slow, pytest.mark.golden]


def test_planted_teacher_logits_fail_the_distillation_golden(tmp_path, monkeypatch):
    monkeypatch.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.teacher_logits_planted_wrong")
    execution = flows.execute(WORKLOAD, run_dir=tmp_path / "run", platform="cpu")
    assert execution.ok, execution.problems()
    verdict = flows.compare_with_golden(execution, "cpu")
    assert not verdict.ok
    failed = [f for f in verdict.findings if f.status in ("fail", "stale")]
    step1 = {f.key.rsplit("/", 1)[-1] for f in failed if f.surface == "training" and f.section == "step0001"}
    assert {"distill_kl", "loss"} <= step1, step1
    teacher_step1 = [f for f in failed if f.surface in ("operators", "collectives", "lifecycle")
                     and (f.section or "").startswith("teacher/") and f.phase == "teacher/step1"]
    assert not teacher_step1, teacher_step1
