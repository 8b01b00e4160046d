"""Masked reductions shared by the loss, the KL term and the metrics.

Contract: `masked_mean(x, mask, global_normalization_factor=N)` divides the
masked *sum* by a caller-supplied count `N` instead of the local mask count.
When `N` is the count over the whole global batch (all microbatches, all DP
ranks), the per-microbatch results **add up** to the whole-batch mean; this is
what lets a trainer accumulate gradients over microbatches without rescaling.

The `+ MASKED_MEAN_EPS` in every denominator keeps an all-masked input at 0
instead of NaN (NeMo RL uses the same 1e-8).
"""

from __future__ import annotations

import torch

MASKED_MEAN_EPS = 1e-8


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x * mask` over `dim` (all elements when `dim` is None).

    Entries where `mask == 0` are excluded by selection, not only by the
    multiplication, so a non-finite value there (e.g. -inf logprobs on
    padding) cannot turn the sum into NaN, and receives zero gradient.
    """
    product = torch.where(mask != 0, x * mask, torch.zeros((), dtype=x.dtype))
    return product.sum() if dim is None else product.sum(dim=dim)


def masked_mean(
    x: torch.Tensor,
    mask: torch.Tensor,
    global_normalization_factor: torch.Tensor | float | None = None,
    *,
    dim: int | None = None,
) -> torch.Tensor:
    """Mean of `x` where `mask` is 1.

    Without `global_normalization_factor` the denominator is the local mask
    count (`mask.sum(dim)`); with it, the denominator is that factor for every
    output element. `mask` must broadcast against `x`; masked-out entries of
    `x` never influence the result, even when they are inf or NaN.
    """
    total = masked_sum(x, mask, dim)
    if global_normalization_factor is None:
        count = mask.sum() if dim is None else mask.sum(dim=dim)
    else:
        count = global_normalization_factor
    return total / (count + MASKED_MEAN_EPS)


def masked_min_max(x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(min, max) of `x` over `mask == 1`; `(+inf, -inf)` when nothing is valid.

    The infinite sentinels make a min/max over microbatches correct without
    special cases; `harness.algos.loss.aggregate_microbatch_metrics` turns a
    sentinel that survives aggregation into -1.0 (the value NeMo RL logs).
    """
    selected = x.detach()[mask.detach().bool()]
    if selected.numel() == 0:
        return float("inf"), float("-inf")
    return float(selected.min()), float(selected.max())
