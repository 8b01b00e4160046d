"""``sync`` trainer: data passed directly, monolithic ``train`` (NeMo RL's legacy path)."""

from __future__ import annotations

from harness.grpo.trainer import Trainer


class SyncTrainer(Trainer):
    name = "sync"

    def train_phase(self, step: int, batch: dict, timings: dict) -> dict[str, float]:
        self.logprobs(batch, timings)
        return dict(self.policy.train(batch))
