"""Context parallelism: load-balanced zig-zag sequence chunks, causal
attention over K/V all-gathered across the CP group.

The padded sequence of length S is cut into `2*cp` chunks of `S/(2cp)`; CP
rank i holds chunks i and `2cp-1-i` (so every rank does the same amount of
causal work). All tokens outside attention are independent, so only attention
communicates: K and V are all-gathered (backward: reduce-scatter of dK, dV)
and masked by absolute position. The final per-token logprobs are gathered
back into sequence order (`unchunk`).
"""

from __future__ import annotations

import torch

from harness import ops
from harness.devices import moved
from harness.parallel import comm

SEQ_DIM = 1


def zigzag_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """Absolute positions held by `cp_rank`, in local order (`[S/cp]`, long)."""
    if cp == 1:
        return torch.arange(seq_len)
    if seq_len % (2 * cp):
        raise ValueError(f"policy.seq_len={seq_len} must be divisible by 2*cp={2 * cp}")
    chunk = seq_len // (2 * cp)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    j = 2 * cp - 1 - cp_rank
    second = torch.arange(j * chunk, (j + 1) * chunk)
    return torch.cat([first, second])


def gathered_positions(seq_len: int, cp: int) -> torch.Tensor:
    """Positions in the order an all-gather over CP lays out local chunks."""
    return torch.cat([zigzag_positions(seq_len, cp, r) for r in range(cp)])


def cp_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor, seq_len: int, cp_group, cp: int
) -> torch.Tensor:
    """Causal attention for this rank's queries against the whole sequence's
    keys. q `[b, s, hq, d]`, k/v `[b, s, hkv, d]` (local chunk)."""
    k_all = comm.all_gather(k, cp_group, SEQ_DIM)
    v_all = comm.all_gather(v, cp_group, SEQ_DIM)
    return ops.causal_attention(q, k_all, v_all, q_positions, moved(gathered_positions(seq_len, cp), q.device))


def unchunk(values: torch.Tensor, seq_len: int, cp_group, cp: int) -> torch.Tensor:
    """Gather per-position values `[b, S/cp]` from all CP ranks into sequence
    order `[b, S]`, replicated on every CP rank (backward: each rank keeps the
    gradient of its own positions)."""
    gathered = comm.gather_replicated(values, cp_group, SEQ_DIM)
    pos = gathered_positions(seq_len, cp)
    inverse = torch.empty_like(pos)
    inverse[pos] = torch.arange(pos.numel())
    return gathered.index_select(SEQ_DIM, moved(inverse, gathered.device))
