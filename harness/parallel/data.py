"""Data parallelism: gradient reduction, global counts, global grad norm.

Parameter classes (`ParamKind`), decided by the parallel model per parameter:
- `tp_sharded`: dense, sharded over TP (q/k/v/o, embedding, lm_head):
  gradients summed over `dp_cp`;
- `tp_replicated`: dense, identical on TP ranks but fed partial tokens/heads
  (norms, q/k norms, router): summed over `tp`, then over `dp_cp`;
- `expert`: local experts: summed over `edp` (ranks holding the same experts).
Losses are normalised by global counts, so reductions are sums (no averaging).
Reductions are coalesced into one flat buffer per (group, class), in
parameter order, so each step issues a fixed, small set of all-reduces. Their results are recorded for the
numerics probe (`harness.taps.collective`, phase backward).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist

from harness import taps
from harness.devices import collective_device

TP_SHARDED, TP_REPLICATED, EXPERT = "tp_sharded", "tp_replicated", "expert"


def _all_reduce_flat(tensors: list[torch.Tensor], group) -> None:
    if group is None or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    taps.collective("all_reduce", group, flat, phase="backward")
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def reduce_gradients(params: Iterable[tuple[str, torch.nn.Parameter]], kinds: dict[str, str], groups) -> None:
    """Sum gradients over the groups their class requires (in place).
    Parameters without a gradient get a zero gradient first, so every rank
    contributes the same buffer layout."""
    by_kind: dict[str, list[torch.Tensor]] = {TP_SHARDED: [], TP_REPLICATED: [], EXPERT: []}
    for name, p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_kind[kinds[name]].append(p.grad)
    _all_reduce_flat(by_kind[TP_REPLICATED], groups["tp"])
    _all_reduce_flat(by_kind[TP_SHARDED] + by_kind[TP_REPLICATED], groups["dp_cp"])
    _all_reduce_flat(by_kind[EXPERT], groups["edp"])


def global_grad_norm(
    params: Iterable[tuple[str, torch.nn.Parameter]], kinds: dict[str, str], coords: dict[str, int]
) -> float:
    """L2 norm of the full model's gradient (after `reduce_gradients`), the
    same value on every rank: each shard is counted by exactly one rank, then
    a world all-reduce sums the squares."""
    sq = torch.zeros((), dtype=torch.float64, device=collective_device())
    dense_owner = coords["dp"] == 0 and coords["cp"] == 0
    for name, p in params:
        kind = kinds[name]
        if kind == EXPERT:
            counted = coords["edp"] == 0
        elif kind == TP_REPLICATED:
            counted = dense_owner and coords["tp"] == 0
        else:
            counted = dense_owner
        if counted and p.grad is not None:
            sq += p.grad.detach().to(torch.float64).pow(2).sum()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sq, op=dist.ReduceOp.SUM)
        taps.collective("all_reduce", None, sq, phase="backward")
    return math.sqrt(float(sq))


def clip_gradients(params: Iterable[torch.nn.Parameter], total_norm: float, max_norm: float | None) -> float:
    """Scale gradients by `max_norm / (total_norm + 1e-6)` when above `max_norm`;
    returns the coefficient applied (1.0 when not clipped)."""
    if not max_norm or total_norm <= max_norm:
        return 1.0
    coef = max_norm / (total_norm + 1e-6)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)
    return coef


def all_reduce_counts(values: list[float], group) -> list[float]:
    """Sum scalar counts (valid tokens/sequences) over a group (fp64)."""
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    if group is not None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        taps.collective("all_reduce", group, t)
    return t.tolist()


def shard_for_dp(batch: Mapping[str, torch.Tensor], dp: int, dp_rank: int) -> dict[str, torch.Tensor]:
    """Contiguous DP shard of every tensor along dim 0."""
    b = batch["input_ids"].shape[0]
    if b % dp:
        raise ValueError(f"batch of {b} samples does not split over policy.dp={dp}")
    n = b // dp
    return {k: v[dp_rank * n : (dp_rank + 1) * n] for k, v in batch.items()}
