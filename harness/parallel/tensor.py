"""Tensor parallelism with sequence parallelism (Megatron style, TP group).

Between blocks the residual stream is sequence-sharded over TP: `[b, S/tp, H]`.
A column-parallel block all-gathers the sequence first (backward:
reduce-scatter); a row-parallel block reduce-scatters its partial sums back to
sequence shards (backward: all-gather). Weights are sharded by output rows
(column-parallel: q/k/v, lm_head, embedding rows = vocab) or input columns
(row-parallel: o_proj). Parameters replicated across TP (norms, q/k norms,
router) see only part of the tokens or heads, so their gradients are summed
over TP (`harness.parallel.data`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness import taps
from harness.ops import one_hot
from harness.parallel import comm

SEQ_DIM = 1


def shard_rows(full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rows `[rank*n/size, (rank+1)*n/size)` (column-parallel / vocab shard)."""
    return full.chunk(size, dim=0)[rank].clone()


def shard_cols(full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Columns (row-parallel input dim)."""
    return full.chunk(size, dim=1)[rank].clone()


def sp_gather(x: torch.Tensor, tp_group) -> torch.Tensor:
    """`[b, S/tp, H] -> [b, S, H]` before a column-parallel block."""
    return comm.all_gather(x, tp_group, SEQ_DIM)


def row_parallel_sp(x: torch.Tensor, weight_shard: torch.Tensor, tp_group) -> torch.Tensor:
    """Row-parallel linear on the full local sequence, reduce-scattered to
    sequence shards: `[b, S, in/tp] -> [b, S/tp, out]`."""
    return comm.reduce_scatter(F.linear(x, weight_shard), tp_group, SEQ_DIM)


def vocab_parallel_embedding(ids: torch.Tensor, weight_shard: torch.Tensor, vocab_start: int, tp_group) -> torch.Tensor:
    """Embedding with vocab rows sharded over TP, output sequence-sharded:
    `ids [b, S] -> [b, S/tp, H]`. Ids outside this shard contribute zeros; the
    reduce-scatter sums the shards."""
    local = ids - vocab_start
    in_range = (local >= 0) & (local < weight_shard.shape[0])
    emb = F.embedding(local.clamp(0, weight_shard.shape[0] - 1), weight_shard)
    emb = emb * in_range.unsqueeze(-1).to(emb.dtype)
    return comm.reduce_scatter(emb, tp_group, SEQ_DIM)


class _VocabParallelLogprobs(torch.autograd.Function):
    """log softmax(logits)[target] with the vocab sharded over TP.

    All-reduces the max, the sum of exponentials and the target logit (three
    all-reduces over TP). Gradient w.r.t. the local logits is
    `g * (onehot_local - softmax_local)`."""

    @staticmethod
    def forward(ctx, logits, targets, vocab_start, group):
        l32 = logits.to(torch.float32)
        vloc = l32.shape[-1]
        m = l32.max(dim=-1).values
        if group is not None:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
            taps.collective("all_reduce_max", group, m)
        shifted = l32 - m.unsqueeze(-1)
        exp = shifted.exp()
        sumexp = exp.sum(dim=-1)
        local_t = targets - vocab_start
        in_range = (local_t >= 0) & (local_t < vloc)
        safe_t = local_t.clamp(0, vloc - 1)
        tgt = shifted.gather(-1, safe_t.unsqueeze(-1)).squeeze(-1) * in_range.to(shifted.dtype)
        if group is not None:
            both = torch.stack([sumexp, tgt])
            dist.all_reduce(both, op=dist.ReduceOp.SUM, group=group)
            taps.collective("all_reduce", group, both)
            sumexp, tgt = both[0], both[1]
        ctx.save_for_backward(exp / sumexp.unsqueeze(-1), safe_t, in_range)
        ctx.logits_dtype = logits.dtype
        return tgt - sumexp.log()

    @staticmethod
    def backward(ctx, g):
        softmax, safe_t, in_range = ctx.saved_tensors
        grad = -softmax * g.unsqueeze(-1)
        onehot = one_hot(safe_t, softmax.shape[-1]).to(grad.dtype) * in_range.unsqueeze(-1).to(grad.dtype)
        grad = grad + onehot * g.unsqueeze(-1)
        return grad.to(ctx.logits_dtype), None, None, None


def vocab_parallel_logprobs(
    logits_shard: torch.Tensor, targets: torch.Tensor, vocab_start: int, tp_group
) -> torch.Tensor:
    """`[b, s, V/tp]` local logits, `[b, s]` targets -> `[b, s]` fp32 logprobs,
    identical on every TP rank."""
    return _VocabParallelLogprobs.apply(logits_shard, targets, vocab_start, tp_group)
