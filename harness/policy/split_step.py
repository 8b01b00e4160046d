"""The split train API's state machine, shared by every policy backend.

``begin_train_step -> train_microbatch (N x) -> finish_train_step`` or
``abort_train_step`` (NeMo RL's contract):

* one open step per worker: ``begin`` while open raises ``STEP_ALREADY_OPEN``;
  ``train_microbatch`` / ``finish`` without an open step raise ``NO_STEP_OPEN``;
* microbatches run with placeholder global counts of 1; ``finish`` all-reduces
  the real valid-token / sequence counts over DP, scales the gradients by 1 /
  count before the optimizer step (clipping sees the scaled gradients), and
  rescales the metrics by their normalisations;
* ``finish`` of a step without a microbatch is refused (``EMPTY_STEP``) and
  takes no optimizer step; the step stays open for ``abort``;
* ``abort`` drops the gradients and is idempotent.

A backend provides ``optimizer``, ``loss_fn``, ``is_last`` (this rank computes
metrics), ``split_dp_group`` (the group the counts are summed over) and
``_forward_backward``, ``_combine_over_dp``, ``_optimizer_step``, ``_step_metrics``
(``_optimizer_step`` and the monolithic ``train``: ``harness.policy.train_step.TrainStep``,
a subclass of this one, which every backend uses).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.algos.loss import aggregate_microbatch_metrics, global_valid_counts, rescale_metrics
from harness.parallel import data as dp_data

STEP_ALREADY_OPEN = "a train step is already open; finish or abort it before beginning another"
NO_STEP_OPEN = "no train step open; call begin_train_step first"
EMPTY_STEP = "the open train step has no microbatch; abort it instead of finishing (no optimizer step taken)"


class SplitTrainStep:
    _split: dict[str, Any] | None = None

    @property
    def step_open(self) -> bool:
        return self._split is not None

    def begin_train_step(self) -> None:
        if self._split is not None:
            raise RuntimeError(STEP_ALREADY_OPEN)
        self.optimizer.zero_grad(set_to_none=True)
        self._split = {"seqs": 0.0, "toks": 0.0, "metrics": [], "microbatches": 0}

    def train_microbatch(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Forward+backward of one chunk (this rank's DP shard) with placeholder
        global counts of 1; returns the chunk's raw (unscaled) metrics."""
        if self._split is None:
            raise RuntimeError(NO_STEP_OPEN)
        seqs, toks = global_valid_counts(batch)
        per_mb = self._forward_backward(batch, 1.0, 1.0)
        self._split["seqs"] += seqs
        self._split["toks"] += toks
        self._split["metrics"].extend(per_mb)  # only the last pipeline stage computes metrics
        self._split["microbatches"] += 1
        return aggregate_microbatch_metrics(per_mb) if per_mb else {}

    def finish_train_step(self) -> dict[str, float]:
        if self._split is None:
            raise RuntimeError(NO_STEP_OPEN)
        if not self._split["microbatches"]:
            raise RuntimeError(EMPTY_STEP)  # the step stays open; abort_train_step closes it
        state, self._split = self._split, None
        try:
            seqs, toks = dp_data.all_reduce_counts([state["seqs"], state["toks"]], self.split_dp_group)
            normaliser = toks if self.loss_fn.token_level_loss else seqs
            combined = self._combine_over_dp(state["metrics"]) if self.is_last else {}
            norm = self._optimizer_step(grad_scale=1.0 / normaliser if normaliser else 0.0)
            if self.is_last:
                combined = rescale_metrics(combined, self.loss_fn.metric_normalizations, seqs, toks)
            return self._step_metrics(combined, norm, seqs, toks)
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)
            raise

    def abort_train_step(self) -> None:
        """Drop the open step's gradients; a no-op when no step is open."""
        if self._split is None:
            return
        self._split = None
        self.optimizer.zero_grad(set_to_none=True)
