"""The description of a step's batched-decode rows: ``DecodeRow`` and ``DecodeBatch``.

``DecodeBatch.build`` orders the running requests' one-token rows by cache length
and precomputes, once per step, the tensors every layer's decode kernel reads
(new tokens, KV row indices, RoPE rows, the attention groups of the grouped
kernels, each row's own RoPE for the row-local ones, slots and lengths for the
invariant ones). It reads ``Forward``'s tables and kernel choice; it computes
no floating-point result of its own beyond gathering those tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from harness.rollout.native.forward import Forward


class DecodeRow(Protocol):
    """What a batched-decode row needs of a running request."""

    slot: int
    cached: int  # positions already in the KV cache
    tokens: list[int]  # prompt + output so far; the last one is the new token


@dataclass
class DecodeBatch:
    """The one-token rows of a step, ordered by cache length (attention groups)."""

    seqs: list[Any]  # the DecodeRow objects, in this order
    tokens: torch.Tensor  # [B] new token ids
    kv_rows: torch.Tensor  # KVCachePool.row_index of (slot, position of the new token)
    cos: torch.Tensor  # [B, 1, D]
    sin_signed: torch.Tensor  # [B, 1, D]
    groups: list[tuple[int, int, int]]  # (first row, end row, cache length incl. the new token)
    group_heads: list[torch.Tensor]  # per group: KVCachePool.head_index of (slot, kv head of each q head)
    row_ropes: list[tuple[torch.Tensor, ...]] | None = None  # row_local: each row's Forward.row_rope
    slots: torch.Tensor | None = None  # invariant kernels: [B] KV slots of the rows
    lengths: torch.Tensor | None = None  # invariant kernels: [B] cache lengths incl. the new token
    max_length: int = 0  # invariant kernels: the longest row's cache length

    @classmethod
    def build(cls, fwd: Forward, seqs: Sequence[DecodeRow]) -> DecodeBatch:
        seqs = sorted(seqs, key=lambda s: s.cached)
        for s in seqs:
            if len(s.tokens) - s.cached != 1:
                raise AssertionError("batched decode rows carry exactly one new token")
            if s.cached >= fwd.cfg.max_position:
                raise RuntimeError(
                    f"sequence length {s.cached + 1} exceeds model.max_position ({fwd.cfg.max_position})"
                )
        dev = fwd.device
        if fwd.kernels == "invariant":
            return cls._build_invariant(fwd, seqs)
        positions = torch.tensor([s.cached for s in seqs], device=dev)
        slots = torch.tensor([s.slot for s in seqs], device=dev)
        groups: list[tuple[int, int, int]] = []
        for i, s in enumerate(seqs):
            if groups and groups[-1][2] == s.cached + 1:
                groups[-1] = (groups[-1][0], i + 1, s.cached + 1)
            else:
                groups.append((i, i + 1, s.cached + 1))
        heads = fwd.kv.head_index(slots, fwd.kv_head_of_q)
        hq = fwd.plan.local_heads
        return cls(
            seqs=seqs,
            tokens=torch.tensor([s.tokens[-1] for s in seqs], device=dev),
            kv_rows=fwd.kv.row_index(slots, positions),
            cos=fwd.rope_cos[positions].unsqueeze(1),
            sin_signed=fwd.rope_sin_signed[positions].unsqueeze(1),
            groups=groups,
            group_heads=[heads[g0 * hq : g1 * hq] for g0, g1, _ in groups],
            row_ropes=[fwd.row_rope(s.cached, 1) for s in seqs] if fwd.row_local else None,
        )

    @classmethod
    def _build_invariant(cls, fwd: Forward, seqs: list[Any]) -> DecodeBatch:
        """The rows' tensors for the invariant kernels (no length groups): one host copy."""
        host = torch.tensor([[s.cached for s in seqs], [s.slot for s in seqs], [s.tokens[-1] for s in seqs]])
        positions, slots, tokens = host.to(fwd.device).unbind(0)
        return cls(
            seqs=seqs,
            tokens=tokens,
            kv_rows=fwd.kv.row_index(slots, positions),
            cos=fwd.rope_cos[positions].unsqueeze(1),
            sin_signed=fwd.rope_sin_signed[positions].unsqueeze(1),
            groups=[],
            group_heads=[],
            slots=slots,
            lengths=positions + 1,
            max_length=seqs[-1].cached + 1,
        )
