"""Reward, advantage and rollout summaries with NeMo RL's metric names (§1.6).

Every function returns `dict[str, float]` of finite values, ready for
`metrics.jsonl` (the trainer adds the `train/` prefix, if any). Names:

- `reward_metrics`: `reward` (mean), `advantages/mean|min|max|sum` over valid
  response tokens, `baseline_reward/pct_0|pct_1|pct_mixed` (percent of
  samples whose group baseline is exactly 0, exactly 1, or anything else).
- `rollout_metrics`: `mean_prompt_length`, `total_num_tokens`,
  `mean_total_tokens_per_sample`, `mean_gen_tokens_per_sample`,
  `max_gen_tokens_per_sample`, `natural_termination_rate`, `truncation_rate`,
  and, for multi-turn rollouts, `total_turns`, `avg_turns_per_sample`,
  `max_turns_per_sample`, `max_turns_reached_rate`, `mean_env_tokens_per_sample`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.algos.advantages import baseline_and_std_per_prompt


def reward_metrics(
    prompt_ids: torch.Tensor,
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    *,
    leave_one_out: bool = True,
) -> dict[str, float]:
    """Reward and advantage summaries of one step's batch.

    `advantages` may be `[B]` (per sample) or `[B, S]` (per token); the
    statistics are over tokens with `token_mask == 1` (0.0 when there are none).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand(token_mask.shape)
    valid = advantages[token_mask.bool()].to(torch.float64)
    baseline, _ = baseline_and_std_per_prompt(prompt_ids, rewards, leave_one_out=leave_one_out)
    n = max(int(baseline.numel()), 1)
    pct_0 = 100.0 * float((baseline == 0).sum()) / n
    pct_1 = 100.0 * float((baseline == 1).sum()) / n
    has_valid = valid.numel() > 0
    return {
        "reward": float(rewards.to(torch.float64).mean()) if rewards.numel() else 0.0,
        "advantages/mean": float(valid.mean()) if has_valid else 0.0,
        "advantages/min": float(valid.min()) if has_valid else 0.0,
        "advantages/max": float(valid.max()) if has_valid else 0.0,
        "advantages/sum": float(valid.sum()) if has_valid else 0.0,
        "baseline_reward/pct_0": pct_0,
        "baseline_reward/pct_1": pct_1,
        "baseline_reward/pct_mixed": 100.0 - pct_0 - pct_1,
    }


def rollout_metrics(
    prompt_lengths: Sequence[int],
    gen_lengths: Sequence[int],
    finish_reasons: Sequence[str],
    *,
    turns: Sequence[int] | None = None,
    max_turns: int | None = None,
    env_lengths: Sequence[int] | None = None,
) -> dict[str, float]:
    """Length and termination summaries over the samples of one step.

    `finish_reasons` holds the engine's `eos` | `length` per sample (for a
    multi-turn rollout: of its last call). `gen_lengths` counts generated
    tokens, `env_lengths` tokens the environment inserted (tool responses,
    re-rendered template tokens). Sequences must all have one entry per sample.
    """
    n = len(gen_lengths)
    if len(prompt_lengths) != n or len(finish_reasons) != n:
        raise ValueError(
            f"rollout_metrics: prompt_lengths ({len(prompt_lengths)}), gen_lengths ({n}) and "
            f"finish_reasons ({len(finish_reasons)}) must have one entry per sample"
        )
    unknown = sorted(set(finish_reasons) - {"eos", "length"})
    if unknown:
        raise ValueError(f"rollout_metrics: unknown finish_reason(s) {unknown}; expected eos | length")
    if n == 0:
        return {}
    env = list(env_lengths) if env_lengths is not None else [0] * n
    totals = [p + g + e for p, g, e in zip(prompt_lengths, gen_lengths, env)]
    out = {
        "mean_prompt_length": sum(prompt_lengths) / n,
        "total_num_tokens": float(sum(totals)),
        "mean_total_tokens_per_sample": sum(totals) / n,
        "mean_gen_tokens_per_sample": sum(gen_lengths) / n,
        "max_gen_tokens_per_sample": float(max(gen_lengths)),
        "natural_termination_rate": sum(r == "eos" for r in finish_reasons) / n,
        "truncation_rate": sum(r == "length" for r in finish_reasons) / n,
    }
    if turns is not None:
        if len(turns) != n:
            raise ValueError(f"rollout_metrics: turns has {len(turns)} entries, expected {n}")
        out["total_turns"] = float(sum(turns))
        out["avg_turns_per_sample"] = sum(turns) / n
        out["max_turns_per_sample"] = float(max(turns))
        if max_turns is not None:
            out["max_turns_reached_rate"] = sum(t >= max_turns for t in turns) / n
    if env_lengths is not None:
        out["mean_env_tokens_per_sample"] = sum(env) / n
    return out
