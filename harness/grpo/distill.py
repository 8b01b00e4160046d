"""``distill`` trainer: GRPO with the student's loss pulled towards a teacher (on-policy distillation).

A step is the ``sync`` trainer's (data passed directly, monolithic ``train``)
with one pass before the logprobs: the teacher group
(``harness.distill.teacher.TeacherGroup``, started by the session) computes
the logits of the step's batch into its IPC buffers, and the batch carries the
aggregated per-sample refs as ``teacher_refs``; the student's ranks read them
in their loss (``harness.distill.student.DistillLoss``). Timing
``teacher_logits`` is the teacher pass.
"""

from __future__ import annotations

import time
from typing import Any

from harness.grpo.sync import SyncTrainer


class DistillTrainer(SyncTrainer):
    name = "distill"

    def __init__(self, *args: Any, teacher: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if teacher is None:
            raise ValueError("grpo.trainer: distill needs the teacher group (started from the distill: block)")
        self.teacher = teacher

    def train_phase(self, step: int, batch: dict, timings: dict) -> dict[str, float]:
        t = time.perf_counter()
        batch["teacher_refs"] = self.teacher.logits_refs(batch)
        timings["teacher_logits"] = time.perf_counter() - t
        return super().train_phase(step, batch, timings)
