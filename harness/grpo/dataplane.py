"""``dataplane`` trainer: bulk tensors live in the durable data plane.

The driver stages the step's batch under ``step{N}/batch`` and hands the
policy only that key; the policy workers fetch their own shard from the data
plane (NeMo RL's TransferQueue-mediated ``grpo_train_sync``). Logprobs come
back as new staged keys, so no bulk tensor crosses the driver twice.
"""

from __future__ import annotations

import time

from harness.grpo.trainer import Trainer


class DataPlaneTrainer(Trainer):
    name = "dataplane"

    def train_phase(self, step: int, batch: dict, timings: dict) -> dict[str, float]:
        if self.dataplane is None:
            raise RuntimeError("grpo.trainer=dataplane needs the data plane (capture.enabled or a data plane actor)")
        key = f"step{step:04d}/batch"
        handle = self.dataplane.handle
        t = time.perf_counter()
        self.dataplane.put_tensors(key, batch)
        prev_key = self.policy.logprobs_by_key(handle, key, f"step{step:04d}/prev_logprobs")
        ref_key = self.policy.logprobs_by_key(handle, key, f"step{step:04d}/reference_logprobs", reference=True)
        timings["policy_and_reference_logprobs"] = time.perf_counter() - t
        return dict(self.policy.train_by_key(handle, key, [prev_key, ref_key]))
