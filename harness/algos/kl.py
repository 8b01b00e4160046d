"""Per-token KL estimators between the current policy and a reference policy.

Inputs are the log-probabilities of the *sampled* tokens under both policies.
With `logr = reference - current` (clamped to `+-input_clamp`):

- `k1 = -logr`                 (= current - reference; unbiased, can be < 0)
- `k2 = logr**2 / 2`           (>= 0)
- `k3 = exp(logr) - 1 - logr`  (>= 0, zero iff current == reference; the
                                GRPO default, Schulman's low-variance estimator;
                                computed as `expm1(logr) - logr`, which stays
                                >= 0 in float32 where the naive form goes
                                negative for |logr| < ~1e-7)

Optional importance weights multiply the estimate; on tokens where the input
clamp was active they are detached (no gradient through a clamped ratio). The
result is finally clamped to `+-output_clamp`. `None` disables a clamp.
"""

from __future__ import annotations

import torch

KL_TYPES: tuple[str, ...] = ("k1", "k2", "k3")


def calculate_kl(
    logprobs: torch.Tensor,
    logprobs_reference: torch.Tensor,
    *,
    kl_type: str = "k3",
    input_clamp: float | None = 20.0,
    output_clamp: float | None = 10.0,
    importance_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Element-wise KL estimate of `logprobs` (current) against `logprobs_reference`.

    Raises `ValueError` for a `kl_type` outside `KL_TYPES`. The output has the
    broadcast shape of the inputs and is differentiable w.r.t. both.
    """
    if kl_type not in KL_TYPES:
        raise ValueError(f"kl_type must be one of {list(KL_TYPES)}, got {kl_type!r}")
    logr = logprobs_reference - logprobs
    if input_clamp is not None:
        clamped_region = logr.detach().abs() > input_clamp
        logr = logr.clamp(min=-input_clamp, max=input_clamp)
    else:
        clamped_region = None

    if kl_type == "k1":
        kl = -logr
    elif kl_type == "k2":
        kl = logr.square() / 2
    else:
        kl = torch.expm1(logr) - logr  # = exp(logr) - 1 - logr, without cancellation below 0

    if importance_weights is not None:
        weights = importance_weights
        if clamped_region is not None:
            weights = torch.where(clamped_region, weights.detach(), weights)
        kl = kl * weights

    if output_clamp is not None:
        kl = kl.clamp(min=-output_clamp, max=output_clamp)
    return kl
