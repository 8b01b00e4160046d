"""Autograd-aware collectives shared by the parallelism modules.

Each function is the identity when `group is None` (a kind whose groups all
have one rank, see `ProcessGroups`). Gathers and scatters work on any `dim`
by moving it to the front; sizes along that dim must be equal on all ranks
(gloo has no uneven all_gather / reduce_scatter: callers pad, see
`pad_to_multiple`). Each records its result after the wait for the numerics
probe (`harness.taps.collective`; nothing without one). Backward pairs:

    all_gather        fwd gather      bwd reduce-scatter(sum)   (input used by every rank)
    reduce_scatter    fwd reduce-scat bwd all-gather
    gather_replicated fwd gather      bwd own slice             (downstream replicated on every rank)
    all_reduce_sum    fwd all-reduce  bwd identity              (downstream replicated on every rank)
    all_to_all        fwd a2a(splits) bwd a2a(swapped splits)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness import taps


# torch 2.13 renamed the tensor-form collectives; use the new names when present. Looked up at
# call time, so the wrappers of harness.parallel.settle apply whenever they were installed.
def _all_gather_tensor(out: torch.Tensor, x: torch.Tensor, *, group) -> None:
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x, group=group)


def _reduce_scatter_tensor(out: torch.Tensor, x: torch.Tensor, *, op, group) -> None:
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, x, op=op, group=group)


def _size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _rank(group) -> int:
    return 0 if group is None else dist.get_rank(group)


def _gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    front = x.movedim(dim, 0).contiguous()
    out = torch.empty((n * front.shape[0],) + tuple(front.shape[1:]), dtype=x.dtype, device=x.device)
    _all_gather_tensor(out, front, group=group)
    taps.collective("all_gather", group, out)
    return out.movedim(0, dim)


def _reduce_scatter(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    front = x.movedim(dim, 0).contiguous()
    if front.shape[0] % n:
        raise ValueError(f"reduce_scatter: dim {dim} size {front.shape[0]} not divisible by group size {n}")
    out = torch.empty((front.shape[0] // n,) + tuple(front.shape[1:]), dtype=x.dtype, device=x.device)
    _reduce_scatter_tensor(out, front, op=dist.ReduceOp.SUM, group=group)
    taps.collective("reduce_scatter", group, out)
    return out.movedim(0, dim)


def _slice(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    return x.chunk(n, dim=dim)[_rank(group)].contiguous()


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _gather(x, group, dim)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter(g, ctx.group, ctx.dim), None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _reduce_scatter(x, group, dim)

    @staticmethod
    def backward(ctx, g):
        return _gather(g, ctx.group, ctx.dim), None, None


class _GatherReplicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _gather(x, group, dim)

    @staticmethod
    def backward(ctx, g):
        return _slice(g, ctx.group, ctx.dim), None, None


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        if _size(group) == 1:
            return x
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
        taps.collective("all_reduce", group, x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.group, ctx.out_splits, ctx.in_splits = group, out_splits, in_splits
        return _a2a(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, g):
        return _a2a(g.contiguous(), ctx.in_splits, ctx.out_splits, ctx.group), None, None, None


def _a2a(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    if _size(group) == 1:
        return x
    out = torch.empty((sum(out_splits),) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    taps.collective("all_to_all", group, out)
    return out


def all_gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    return _AllGather.apply(x, group, dim)


def reduce_scatter(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    return _ReduceScatter.apply(x, group, dim)


def gather_replicated(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    return _GatherReplicated.apply(x, group, dim)


def all_reduce_sum(x: torch.Tensor, group) -> torch.Tensor:
    return _AllReduceSum.apply(x, group)


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Rows `x[sum(in_splits[:j]) : ...]` go to group rank j; returns the rows
    received, `out_splits[j]` from rank j, in rank order."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group)


def exchange_counts(counts: torch.Tensor, group) -> torch.Tensor:
    """All-to-all of a `[n, m]` long tensor: row j goes to rank j; returns
    `[n, m]` where row j came from rank j (no autograd)."""
    if _size(group) == 1:
        return counts
    out = torch.empty_like(counts)
    dist.all_to_all_single(out, counts.contiguous(), group=group)
    taps.collective("exchange_counts", group, out)
    return out


def pad_to_multiple(x: torch.Tensor, multiple: int, dim: int = 0) -> tuple[torch.Tensor, int]:
    """Zero-pad `dim` up to a multiple (gloo needs equal sizes); returns (padded, original size)."""
    n = x.shape[dim]
    pad = (-n) % multiple
    if pad == 0:
        return x, n
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_zeros(shape)], dim=dim), n
