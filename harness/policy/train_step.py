"""The optimizer step and the monolithic ``train`` shared by every policy backend.

:class:`TrainStep` adds to the split train API (:class:`~harness.policy.split_step.SplitTrainStep`)

* ``_optimizer_step(grad_scale)``: reduce the gradients (``_reduce_gradients``), scale
  them by ``grad_scale`` when given, take their global norm (``_grad_norm``), clip to
  ``max_grad_norm``, step the optimizer, drop the gradients, count the step; returns the
  norm (before clipping). That order is the arithmetic every golden was stored with;
* ``train(batch, eval_mode)``: one optimizer step over this rank's DP shard of a global
  batch with the global valid-sequence / token counts summed over ``split_dp_group``;
  with ``eval_mode`` the loss metrics of the current weights, no step.

A backend provides, besides what ``SplitTrainStep`` needs (``optimizer``, ``loss_fn``,
``is_last``, ``split_dp_group``, ``_forward_backward``, ``_combine_over_dp``,
``_step_metrics``): ``named`` (the trained ``(name, parameter)`` pairs), ``max_grad_norm``,
``mbs``, ``steps_done``, ``get_logprobs``, ``_reduce_gradients()`` (gradients summed over
the groups that hold copies; every parameter of ``named`` has a gradient afterwards) and
``_grad_norm()`` (the global L2 norm, each element counted once).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.algos.loss import global_valid_counts
from harness.parallel import data as dp_data
from harness.policy.split_step import SplitTrainStep


class TrainStep(SplitTrainStep):
    def _optimizer_step(self, grad_scale: float | None = None) -> float:
        self._reduce_gradients()
        if grad_scale is not None:
            for _, p in self.named:
                p.grad.mul_(grad_scale)
        norm = self._grad_norm()
        dp_data.clip_gradients([p for _, p in self.named], norm, self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        return norm

    def train(self, batch: Mapping[str, torch.Tensor], eval_mode: bool = False) -> dict[str, float]:
        """One optimizer step over this rank's DP shard of a global batch (metrics on
        ``is_last`` ranks, ``{}`` elsewhere). With ``eval_mode`` the loss is computed but
        no step is taken. Refused while a split train step is open."""
        if self._split is not None:
            raise RuntimeError(f"policy rank {self.rank}: train() called while a split train step is open")
        seqs, toks = global_valid_counts(batch)
        seqs, toks = dp_data.all_reduce_counts([seqs, toks], self.split_dp_group)
        self.optimizer.zero_grad(set_to_none=True)
        if eval_mode:
            with torch.no_grad():
                per_mb = self._eval_losses(batch, seqs, toks)
            return self._combine_over_dp(per_mb) if self.is_last else {}
        per_mb = self._forward_backward(batch, seqs, toks)
        combined = self._combine_over_dp(per_mb) if self.is_last else {}
        norm = self._optimizer_step()
        return self._step_metrics(combined, norm, seqs, toks)

    def _eval_losses(self, batch: Mapping[str, torch.Tensor], seqs: float, toks: float) -> list[dict[str, float]]:
        """The loss metrics of each micro-batch under the current weights (``[]`` off the last stage)."""
        logprobs = self.get_logprobs(batch)
        if not self.is_last:
            return []
        out = []
        for i in range(0, logprobs.shape[0], self.mbs):
            mb = {k: v[i : i + self.mbs] for k, v in batch.items()}
            out.append(self.loss_fn(logprobs[i : i + self.mbs], mb, seqs, toks)[1])
        return out
