"""GRPO advantages: group baselines over identical prompt rows.

Groups are formed by **identical prompt token rows** (not by index), so two
dataset prompts that tokenize identically share one group, and multi-turn
histories must be reduced to their initial prompt by the caller. Rows of
`prompt_ids` must therefore be padded identically (same pad id, same side).

For a group with n valid members and rewards r:
- leave-one-out (LOO): baseline_i = mean of the other n-1 rewards, std_i =
  unbiased std of those n-1 rewards (0 when n-1 < 2, i.e. G = 2 never
  normalises);
- otherwise: baseline_i = group mean, std_i = unbiased std of the group;
- a group with <= 1 valid member, or whose rewards are all equal, gets
  baseline = reward and std = 0, so its advantage is exactly 0.

`A = r - baseline`; with `normalize`, `A /= (std + eps)` **only where std > 0**
("don't sharpen" zero-variance groups).

Invariants (checked by suites/property/test_grpo_math_props.py): permuting rows
permutes outputs bit-identically (group statistics are computed over *sorted*
rewards); unnormalised advantages sum to ~0 per group; outputs are finite.
Statistics are computed in float64 and cast back to the rewards' dtype.
"""

from __future__ import annotations

import torch


def _group_ids(prompt_ids: torch.Tensor) -> torch.Tensor:
    """Group index per row: rows with identical tokens get the same index."""
    if prompt_ids.dim() != 2:
        raise ValueError(f"prompt_ids must be [B, P], got shape {tuple(prompt_ids.shape)}")
    _, inverse = torch.unique(prompt_ids, dim=0, return_inverse=True)
    return inverse


def _check_rewards(prompt_ids: torch.Tensor, rewards: torch.Tensor) -> None:
    if rewards.dim() != 1 or rewards.shape[0] != prompt_ids.shape[0]:
        raise ValueError(
            f"rewards must be [B] with B = prompt_ids.shape[0] = {prompt_ids.shape[0]}, "
            f"got shape {tuple(rewards.shape)}"
        )
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")


def _stats_of_sorted(values: torch.Tensor) -> tuple[float, float]:
    """(mean, unbiased std) of an already sorted float64 vector; std 0 below 2 values."""
    n = values.numel()
    mean = values.sum() / n
    if n < 2:
        return float(mean), 0.0
    var = ((values - mean) ** 2).sum() / (n - 1)
    return float(mean), float(var.sqrt())


def baseline_and_std_per_prompt(
    prompt_ids: torch.Tensor,
    rewards: torch.Tensor,
    valid_mask: torch.Tensor | None = None,
    *,
    leave_one_out: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row baseline and std (both `[B]`, dtype of `rewards`).

    `valid_mask` (`[B]`, 0/1) excludes rows from every group statistic (e.g.
    rollouts the capture ledger rejected); an invalid row gets
    baseline = its own reward and std = 0.
    """
    _check_rewards(prompt_ids, rewards)
    groups = _group_ids(prompt_ids)
    r64 = rewards.detach().to(torch.float64)
    valid = torch.ones_like(r64, dtype=torch.bool) if valid_mask is None else valid_mask.bool()
    baseline = r64.clone()
    std = torch.zeros_like(r64)

    for g in torch.unique(groups).tolist():
        members = ((groups == g) & valid).nonzero().flatten()
        if members.numel() <= 1:
            continue
        values = r64[members]
        if bool((values == values[0]).all()):
            continue  # all equal: baseline = reward, std 0 -> A exactly 0
        ordered, _ = torch.sort(values)
        if not leave_one_out:
            mean, sd = _stats_of_sorted(ordered)
            baseline[members] = mean
            std[members] = sd
            continue
        for row, value in zip(members.tolist(), values.tolist()):
            # Drop one occurrence of this row's value from the sorted group; equal
            # values are interchangeable, so the result is permutation-invariant.
            drop = int((ordered == value).nonzero()[0])
            others = torch.cat([ordered[:drop], ordered[drop + 1 :]])
            baseline[row], std[row] = _stats_of_sorted(others)
    return baseline.to(rewards.dtype), std.to(rewards.dtype)


def compute_advantages(
    prompt_ids: torch.Tensor,
    rewards: torch.Tensor,
    *,
    leave_one_out: bool = True,
    normalize: bool = True,
    eps: float = 1e-6,
    valid_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-sample GRPO advantages `[B]` (see the module docstring).

    Invalid rows (`valid_mask == 0`) get advantage 0. Broadcast to tokens with
    `expand_to_tokens`.
    """
    baseline, std = baseline_and_std_per_prompt(
        prompt_ids, rewards, valid_mask, leave_one_out=leave_one_out
    )
    r64 = rewards.detach().to(torch.float64)
    adv = r64 - baseline.to(torch.float64)
    if normalize:
        std64 = std.to(torch.float64)
        adv = torch.where(std64 > 0, adv / (std64 + eps), adv)
    if valid_mask is not None:
        adv = adv * valid_mask.to(torch.float64)
    return adv.to(rewards.dtype)


def expand_to_tokens(advantages: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """`[B]` advantages -> `[B, S]`, constant along the token dimension.

    Only the shape of `token_mask` is used (the loss applies the mask). The
    result is what the loss consumes as `data["advantages"]`.
    """
    if advantages.dim() != 1 or advantages.shape[0] != token_mask.shape[0]:
        raise ValueError(
            f"advantages must be [B] matching token_mask [B, S] = {tuple(token_mask.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    return advantages.to(token_mask.dtype)[:, None].expand(token_mask.shape).clone()
