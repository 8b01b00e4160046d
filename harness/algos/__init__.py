"""Pure GRPO math over torch tensors: advantages, KL, the clipped-PG loss, metrics.

No Ray, no process groups, no I/O: importable by policy workers, trainers
and tests alike. See docs/algos.md.
"""

from harness.algos.advantages import baseline_and_std_per_prompt, compute_advantages, expand_to_tokens
from harness.algos.kl import KL_TYPES, calculate_kl
from harness.algos.loss import (
    ClippedPGLoss,
    aggregate_microbatch_metrics,
    global_valid_counts,
    rescale_metrics,
)
from harness.algos.masked import masked_mean
from harness.algos.metrics import reward_metrics, rollout_metrics

__all__ = [
    "KL_TYPES",
    "ClippedPGLoss",
    "aggregate_microbatch_metrics",
    "baseline_and_std_per_prompt",
    "calculate_kl",
    "compute_advantages",
    "expand_to_tokens",
    "global_valid_counts",
    "masked_mean",
    "rescale_metrics",
    "reward_metrics",
    "rollout_metrics",
]
