"""What every policy backend's engine does the same way, around its own forward.

:class:`EngineCommon` holds the backend-independent parts: the training state
(reference weights, AdamW, loss), checking a train batch, cutting it into
microbatches, combining metrics over DP, the step metrics, and reference
logprobs by swapping the initial weights in. A backend provides ``rank``,
``coords``, ``mbs`` (microbatch size), ``named`` (``[(name, parameter)]``, set
before ``_init_training_state``), ``is_last`` (this rank computes metrics),
``split_dp_group`` (the DP group metrics and counts are combined over; ``None``
at dp 1) and ``get_logprobs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from harness.algos.loss import ClippedPGLoss, aggregate_microbatch_metrics
from harness.policy.master_weights import MasterWeightsAdamW, needs_master_weights
from harness.spec.typed import Workload

TRAIN_KEYS = (
    "input_ids", "input_lengths", "token_mask", "sample_mask", "advantages",
    "prev_logprobs", "generation_logprobs", "reference_policy_logprobs",
)


class EngineCommon:
    def _bind(self, spec: Workload, rank: int) -> Workload:
        """Keep ``spec`` (the plan's typed workload, received as a value) and ``rank``."""
        self.spec = spec
        self.rank = rank
        return self.spec

    def _init_training_state(self, spec: Workload) -> None:
        """Reference weights (the initial ``named`` parameters, on the CPU), AdamW
        over ``named`` in that order (over fp32 master copies for a low-precision
        model of a backend that sets ``MASTER_WEIGHTS``), the loss and the step
        counters. Call once ``named`` holds the rank's loaded parameters.

        AdamW steps tensor by tensor (``foreach=False``) unless the backend sets
        ``FOREACH_ADAMW_ON_CUDA`` and the parameters are on cuda: then torch's
        multi-tensor kernels run (a few launches per step instead of about ten per
        tensor; they round differently, so only where the golden was refreshed on
        them). On the CPU AdamW always steps tensor by tensor."""
        self.reference_state = {n: p.detach().clone().cpu() for n, p in self.named}
        opt = spec.policy.optimizer
        self.lr, self.wd = opt.lr, opt.weight_decay  # floats (the typed block converts numbers)
        self.max_grad_norm = opt.max_grad_norm
        params = [p for _, p in self.named]
        foreach = bool(getattr(self, "FOREACH_ADAMW_ON_CUDA", False) and params and params[0].is_cuda)
        adamw = dict(lr=self.lr, weight_decay=self.wd, betas=(opt.beta1, opt.beta2), eps=opt.eps, foreach=foreach)
        if getattr(self, "MASTER_WEIGHTS", False) and needs_master_weights(params):
            self.optimizer = MasterWeightsAdamW(params, **adamw)  # bf16 model: fp32 masters and AdamW state
        else:
            self.optimizer = torch.optim.AdamW(params, **adamw)
        if spec.distill is not None:  # the GRPO loss plus the KL to the teacher (docs/distill.md)
            from harness.distill.student import DistillLoss

            self.loss_fn = DistillLoss(spec.grpo.loss, spec.distill)
        else:
            self.loss_fn = ClippedPGLoss(spec.grpo.loss)
        self.steps_done = 0
        self._split: dict[str, Any] | None = None

    def _check_train_batch(self, batch: Mapping[str, torch.Tensor]) -> None:
        for key in TRAIN_KEYS:
            if key not in batch:
                raise ValueError(f"policy rank {self.rank}: train batch is missing field {key!r}")

    def _microbatches(self, batch: Mapping[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        b = batch["input_ids"].shape[0]
        if b == 0 or b % self.mbs:
            raise ValueError(
                f"policy rank {self.rank} (dp {self.coords['dp']}): batch of {b} samples is not a positive "
                f"multiple of policy.micro_batch_size={self.mbs}"
            )
        return [{k: v[i : i + self.mbs] for k, v in batch.items()} for i in range(0, b, self.mbs)]

    def _combine_over_dp(self, per_mb: list[dict[str, float]]) -> dict[str, float]:
        """Microbatch metrics of all DP ranks combined (last-stage ranks only)."""
        local = aggregate_microbatch_metrics(per_mb)
        group = self.split_dp_group
        if group is None:
            return local
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, local, group=group)
        return aggregate_microbatch_metrics(gathered)

    def _step_metrics(self, loss_metrics: dict[str, float], norm: float, seqs: float, toks: float) -> dict[str, float]:
        if not self.is_last:
            return {}
        return {**loss_metrics, "grad_norm": norm, "lr": self.lr, "wd": self.wd,
                "global_valid_seqs": seqs, "global_valid_toks": toks}

    @torch.no_grad()
    def get_reference_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logprobs under the initial weights (swapped in, then restored)."""
        current = {n: p.detach().clone() for n, p in self.named}
        try:
            for n, p in self.named:
                p.copy_(self.reference_state[n])
            return self.get_logprobs(batch)
        finally:
            for n, p in self.named:
                p.copy_(current[n])
