"""The GRPO clipped policy-gradient loss (NeMo RL's `ClippedPGLossFn` contract).

Tensor alignment: every per-token input is `[B, S]` aligned with `input_ids`
(`logprobs[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`, column 0 unused)
and is sliced `[:, 1:]` here. The effective mask is
`token_mask[:, 1:] * sample_mask[:, None]`.

Per token: `r = exp(curr - prev)`, `r_c = clamp(r, 1 - ratio_clip_min,
1 + ratio_clip_max)`, `pg = max(-A * r, -A * r_c)`, optionally times the
detached off-policy weight `w = exp(prev - gen)` (importance-sampling
correction; NaN/inf -> 0). KL: `kl_beta * calculate_kl(curr, ref)` with
score-function weights `exp(curr - curr.detach())` (value 1). The reference is
the initial policy.

Reduction: token-level -> `sum(x * mask) / global_valid_toks`; sequence-level
-> per-sequence token mean, then `sum(. * sample_mask) / global_valid_seqs`.
Because denominators are *global* counts, calling the loss on microbatches
and summing gives the whole-batch loss (and the whole-batch value of every
metric whose normalisation is "tokens" or "sequences"; "none" metrics add,
`*_min` / `*_max` metrics reduce by min / max — see
`aggregate_microbatch_metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from harness.algos.kl import KL_TYPES, calculate_kl
from harness.algos.masked import masked_mean, masked_min_max
from harness.spec.typed import as_mapping

# The spec's grpo.loss block (docs/design.md).
LOSS_CONFIG_KEYS: tuple[str, ...] = (
    "ratio_clip_min",
    "ratio_clip_max",
    "kl_beta",
    "kl_type",
    "kl_input_clamp",
    "kl_output_clamp",
    "token_level_loss",
    "use_importance_sampling_correction",
)

# Per-token tensors the loss reads from `data` (all [B, S]) plus sample_mask [B].
TOKEN_KEYS: tuple[str, ...] = (
    "advantages",
    "prev_logprobs",
    "generation_logprobs",
    "reference_policy_logprobs",
    "token_mask",
)

# Normaliser names (NeMo RL's MetricNormalizer).
TOKENS, SEQUENCES, NONE = "tokens", "sequences", "none"


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def global_valid_counts(data: Mapping[str, torch.Tensor]) -> tuple[float, float]:
    """(valid sequences, valid tokens) of a batch, as the loss counts them.

    Sum these over every microbatch and DP rank of a global batch and pass the
    totals to every loss call of that batch.
    """
    sample_mask = data["sample_mask"]
    mask = data["token_mask"][:, 1:] * sample_mask[:, None]
    return float(sample_mask.sum()), float(mask.sum())


class ClippedPGLoss:
    """Callable GRPO loss; construct once per run from the spec's `grpo.loss` dict.

    `metric_normalizations[name]` says how a metric computed on a microbatch
    with placeholder global counts of 1 must be rescaled ("tokens": divide by
    the global valid tokens, "sequences": by the global valid sequences,
    "none": leave). It lists exactly the keys `__call__` returns.
    """

    def __init__(self, cfg: Any):
        """``cfg``: the ``grpo.loss`` block (``harness.spec.typed.LossSpec``) or a plain dict."""
        cfg = as_mapping(cfg)
        unknown = sorted(set(cfg) - set(LOSS_CONFIG_KEYS))
        if unknown:
            raise ValueError(f"grpo.loss: unknown field(s) {unknown}; known: {list(LOSS_CONFIG_KEYS)}")
        missing = [k for k in LOSS_CONFIG_KEYS if k not in cfg]
        if missing:
            raise ValueError(f"grpo.loss: missing field(s) {missing}")
        for key in ("ratio_clip_min", "ratio_clip_max", "kl_beta"):
            value = cfg[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"grpo.loss.{key} must be a number >= 0, got {value!r}")
        if cfg["ratio_clip_min"] >= 1:
            raise ValueError(f"grpo.loss.ratio_clip_min must be < 1, got {cfg['ratio_clip_min']!r}")
        if cfg["kl_type"] not in KL_TYPES:
            raise ValueError(f"grpo.loss.kl_type must be one of {list(KL_TYPES)}, got {cfg['kl_type']!r}")
        for key in ("kl_input_clamp", "kl_output_clamp"):
            value = cfg[key]
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"grpo.loss.{key} must be null or a number > 0, got {value!r}")
        for key in ("token_level_loss", "use_importance_sampling_correction"):
            if not isinstance(cfg[key], bool):
                raise ValueError(f"grpo.loss.{key} must be a boolean, got {cfg[key]!r}")

        self.ratio_clip_min = float(cfg["ratio_clip_min"])
        self.ratio_clip_max = float(cfg["ratio_clip_max"])
        self.kl_beta = float(cfg["kl_beta"])
        self.kl_type: str = cfg["kl_type"]
        self.kl_input_clamp = None if cfg["kl_input_clamp"] is None else float(cfg["kl_input_clamp"])
        self.kl_output_clamp = None if cfg["kl_output_clamp"] is None else float(cfg["kl_output_clamp"])
        self.token_level_loss: bool = cfg["token_level_loss"]
        self.use_importance_sampling_correction: bool = cfg["use_importance_sampling_correction"]

        loss_norm = TOKENS if self.token_level_loss else SEQUENCES
        self.metric_normalizations: dict[str, str] = {
            "loss": loss_norm,
            "kl_penalty": loss_norm,
            "probs_ratio": TOKENS,
            "probs_ratio_clamped": TOKENS,
            "token_mult_prob_error": TOKENS,
            "gen_kl_error": TOKENS,
            "policy_kl_error": TOKENS,
            "js_divergence_error": TOKENS,
            "approx_entropy": TOKENS,
            "sampling_importance_ratio": TOKENS,
            "num_valid_samples": NONE,
            "probs_ratio_min": NONE,
            "probs_ratio_max": NONE,
            "probs_ratio_clamped_min": NONE,
            "probs_ratio_clamped_max": NONE,
        }

    # -- helpers ---------------------------------------------------------------

    def _reduce(
        self,
        per_token: torch.Tensor,
        mask: torch.Tensor,
        sample_mask: torch.Tensor,
        global_valid_seqs: torch.Tensor | float,
        global_valid_toks: torch.Tensor | float,
    ) -> torch.Tensor:
        """Token- or sequence-level reduction with global denominators."""
        if self.token_level_loss:
            return masked_mean(per_token, mask, global_valid_toks)
        per_sequence = masked_mean(per_token, mask, dim=-1)
        return masked_mean(per_sequence, sample_mask, global_valid_seqs)

    @staticmethod
    def _validate(curr_logprobs: torch.Tensor, data: Mapping[str, torch.Tensor]) -> None:
        if curr_logprobs.dim() != 2:
            raise ValueError(f"curr_logprobs must be [B, S], got shape {tuple(curr_logprobs.shape)}")
        shape = tuple(curr_logprobs.shape)
        for key in TOKEN_KEYS:
            if key not in data:
                raise ValueError(f"loss data is missing {key!r} (needs {list(TOKEN_KEYS) + ['sample_mask']})")
            if tuple(data[key].shape) != shape:
                raise ValueError(f"loss data[{key!r}] has shape {tuple(data[key].shape)}, expected {shape}")
        if "sample_mask" not in data:
            raise ValueError("loss data is missing 'sample_mask'")
        if tuple(data["sample_mask"].shape) != shape[:1]:
            raise ValueError(
                f"loss data['sample_mask'] has shape {tuple(data['sample_mask'].shape)}, expected {shape[:1]}"
            )

    # -- the loss --------------------------------------------------------------

    def __call__(
        self,
        curr_logprobs: torch.Tensor,
        data: Mapping[str, torch.Tensor],
        global_valid_seqs: torch.Tensor | float,
        global_valid_toks: torch.Tensor | float,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss (scalar, differentiable w.r.t. `curr_logprobs`) and float metrics."""
        self._validate(curr_logprobs, data)
        curr = curr_logprobs[:, 1:]
        prev = data["prev_logprobs"][:, 1:].detach()
        gen = data["generation_logprobs"][:, 1:].detach()
        ref = data["reference_policy_logprobs"][:, 1:].detach()
        adv = data["advantages"][:, 1:].detach()
        sample_mask = data["sample_mask"].to(curr.dtype)
        mask = data["token_mask"][:, 1:].to(curr.dtype) * sample_mask[:, None]
        seqs, toks = global_valid_seqs, global_valid_toks

        # Off-policy correction weights (forward value only, never a gradient path).
        if self.use_importance_sampling_correction:
            is_weights = _finite_or_zero(torch.exp(prev - gen))
        else:
            is_weights = torch.ones_like(curr)

        # KL to the reference (initial) policy.
        if self.kl_beta != 0:
            score_weights = _finite_or_zero(torch.exp(curr - curr.detach()))
            kl_per_token = self.kl_beta * calculate_kl(
                curr,
                ref,
                kl_type=self.kl_type,
                input_clamp=self.kl_input_clamp,
                output_clamp=self.kl_output_clamp,
                importance_weights=score_weights,
            )
            kl = self._reduce(kl_per_token, mask, sample_mask, seqs, toks)
        else:
            kl = curr.new_zeros(())

        ratio = torch.exp(curr - prev)
        ratio_clamped = ratio.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        pg = torch.maximum(-adv * ratio, -adv * ratio_clamped)
        actor_loss = self._reduce(is_weights * pg, mask, sample_mask, seqs, toks)
        loss = actor_loss + kl

        metrics = self._metrics(curr.detach(), prev, gen, ratio.detach(), ratio_clamped.detach(),
                                is_weights, mask, sample_mask, toks)
        metrics["loss"] = float(loss.detach())
        metrics["kl_penalty"] = float(kl.detach()) / self.kl_beta if self.kl_beta != 0 else 0.0
        return loss, metrics

    def _metrics(
        self,
        curr: torch.Tensor,
        prev: torch.Tensor,
        gen: torch.Tensor,
        ratio: torch.Tensor,
        ratio_clamped: torch.Tensor,
        is_weights: torch.Tensor,
        mask: torch.Tensor,
        sample_mask: torch.Tensor,
        toks: torch.Tensor | float,
    ) -> dict[str, float]:
        """Diagnostics; every value is a plain float (see `metric_normalizations`)."""

        def token_mean(x: torch.Tensor) -> float:
            return float(masked_mean(x, mask, toks))

        # Sampler vs trainer agreement on the sampled tokens (gen ~ P_gen).
        log_gen_minus_train = gen - prev
        gen_kl = calculate_kl(gen, prev, kl_type=self.kl_type, input_clamp=None, output_clamp=None)
        train_over_gen = _finite_or_zero(torch.exp(-log_gen_minus_train))
        policy_kl = train_over_gen * calculate_kl(
            prev, gen, kl_type=self.kl_type, input_clamp=None, output_clamp=None
        )
        # Jensen-Shannon estimate from samples of P_gen: with p = P_gen, q = P_train,
        # m = (p + q) / 2: 0.5 * log(p / m) + 0.5 * (q / p) * log(q / m).
        log_m = torch.logaddexp(gen, prev) - math.log(2.0)
        js = 0.5 * (gen - log_m) + 0.5 * train_over_gen * (prev - log_m)

        ratio_min, ratio_max = masked_min_max(ratio, mask)
        clamped_min, clamped_max = masked_min_max(ratio_clamped, mask)
        return {
            "probs_ratio": token_mean(ratio),
            "probs_ratio_clamped": token_mean(ratio_clamped),
            "probs_ratio_min": ratio_min,
            "probs_ratio_max": ratio_max,
            "probs_ratio_clamped_min": clamped_min,
            "probs_ratio_clamped_max": clamped_max,
            "token_mult_prob_error": token_mean(torch.exp(log_gen_minus_train.abs() * mask)),
            "gen_kl_error": token_mean(gen_kl),
            "policy_kl_error": token_mean(policy_kl),
            "js_divergence_error": token_mean(js),
            "approx_entropy": -token_mean(_finite_or_zero(torch.exp(curr - gen)) * curr),
            "sampling_importance_ratio": token_mean(is_weights),
            "num_valid_samples": float(sample_mask.sum()),
        }


def aggregate_microbatch_metrics(per_microbatch: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Combine the metric dicts of the microbatches of one global batch.

    Keys containing `_min` reduce by min, `_max` by max, every other key by
    sum (correct because each microbatch was normalised by global counts).
    A min/max that saw no valid token anywhere stays at its +-inf sentinel
    and is reported as -1.0, so the result is always finite (NeMo RL logs -1).
    """
    combined: dict[str, float] = {}
    for metrics in per_microbatch:
        for key, value in metrics.items():
            if key not in combined:
                combined[key] = float(value)
            elif "_min" in key:
                combined[key] = min(combined[key], float(value))
            elif "_max" in key:
                combined[key] = max(combined[key], float(value))
            else:
                combined[key] = combined[key] + float(value)
    return {k: (-1.0 if math.isinf(v) else v) for k, v in combined.items()}


def rescale_metrics(
    metrics: Mapping[str, float],
    metric_normalizations: Mapping[str, str],
    global_valid_seqs: float,
    global_valid_toks: float,
) -> dict[str, float]:
    """Rescale metrics computed with placeholder global counts of 1 (split train API).

    A key absent from `metric_normalizations` is an error (it would be
    silently mis-scaled). Keys with `_min` / `_max` are never rescaled.
    """
    divisors = {TOKENS: global_valid_toks, SEQUENCES: global_valid_seqs, NONE: 1.0}
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key not in metric_normalizations:
            raise KeyError(f"metric {key!r} has no entry in metric_normalizations")
        if "_min" in key or "_max" in key:
            out[key] = value
            continue
        divisor = divisors[metric_normalizations[key]]
        out[key] = value / divisor if divisor else 0.0
    return out
