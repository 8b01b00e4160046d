"""``streaming`` trainer: a single controller feeds prompt groups to the split API.

Groups are trained in group order (never completion order) so the step is
bit-reproducible: the controller opens the step lazily on the first group with
valid tokens, runs one ``train_microbatch`` per prompt group, then
``finish_train_step``. A failure aborts the step (the policy profiler records
``policy_train_step_aborted``) and re-raises. Importance-sampling correction is
on for this trainer, as the generating weights may lag the trained ones.
"""

from __future__ import annotations

from harness.grpo.batch import slice_rows
from harness.grpo.trainer import Trainer


class StreamingTrainer(Trainer):
    name = "streaming"

    def train_phase(self, step: int, batch: dict, timings: dict) -> dict[str, float]:
        self.logprobs(batch, timings)
        opened = False
        try:
            for start in range(0, batch["input_ids"].shape[0], self.G):
                group = slice_rows(batch, slice(start, start + self.G))
                if float((group["token_mask"][:, 1:] * group["sample_mask"][:, None]).sum()) == 0.0:
                    continue  # nothing trainable in this group
                if not opened:
                    self.policy.begin_train_step()
                    opened = True
                self.policy.train_microbatch(group)
            if not opened:
                raise RuntimeError(f"step {step}: no prompt group had valid tokens to train on")
            return dict(self.policy.finish_train_step())
        except BaseException:
            if opened:
                self.policy.abort_train_step()
            raise


