"""Batched-decode projections: one bmm whose items are the rows, each row bit-identical
to the per-request ``F.linear`` (or ``ops.swiglu``) of that row alone.

``RowProjection`` covers the dense projections (packed ``[q; k; v]``, ``o``, the
router, ``lm_head``); ``ExpertProjection`` the per (token, expert) slot SwiGLU over
packed expert weights. Each holds a ``mode`` that ``probe.py`` picks on this
machine at start-up; until then (and wherever no batched mode reproduces the
per-request bits) the mode is ``"rows"``, the per-row computation itself.

Why a bmm: CPU BLAS picks different kernels for different row counts, so a
``[B, K] @ [K, N]`` GEMM with ``B > 1`` does not reproduce the ``B = 1`` rows. A
bmm whose item ``i`` is ``[1, K] @ [K, N]`` with the weight as a stride-0
expanded, transposed view is handed to BLAS item by item: the same GEMM as the
single-row ``F.linear``. ATen runs bmm items with ``K * M * N`` below
``SMALL_BMM`` in its own naive kernel instead, so such products stay per row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from harness import ops

# ATen's CPU bmm uses a naive kernel for batch items with K * M * N below this;
# above it, BLAS per item.
SMALL_BMM = 400
# Gather expert weights per slot while the copy stays below this many elements
# per layer; beyond it, loop over the experts present with expanded weights.
GATHER_LIMIT = 1 << 21


def rows_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``[B, K] x [N, K]^T -> [B, N]`` as one bmm whose items are the rows.

    Item ``i`` is the ``[1, K] @ [K, N]`` product with the weight as a
    stride-0 expanded, transposed view: ATen hands it to BLAS item by item,
    the call ``F.linear(x[i:i+1], w)`` makes (``probe.probe_rows`` verifies that
    on this machine before relying on it). ``w`` must be contiguous.
    """
    b, k = x.shape
    return torch.bmm(x.contiguous().view(b, 1, k), w.t().expand(b, k, w.shape[0])).view(b, w.shape[0])


def rows_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The per-request computation: ``F.linear`` of each row alone."""
    return torch.cat([F.linear(x[i : i + 1], w) for i in range(x.shape[0])])


class RowProjection:
    """``x [B, K] -> [B, N_j]`` per column block ``j`` of a packed weight ``[N, K]``, each row
    bit-identical to ``F.linear(row, block_j)`` (the per-request path).

    ``mode`` (set by ``probe.probe_rows``): ``"fused"`` one bmm over the pack, blocks
    sliced off; ``"split"`` one bmm per block; ``"rows"`` ``F.linear`` per row (small
    products, ``K * N < SMALL_BMM``, which ATen's bmm hands to a naive kernel, or BLAS
    builds whose results depend on the output width).
    """

    def __init__(self, pack: torch.Tensor, blocks: Sequence[tuple[int, int]]) -> None:
        self.pack, self.blocks, self.mode = pack, list(blocks), "rows"

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        pack = self.pack
        if self.mode == "fused":
            y = rows_linear(x, pack)
            return [y if (lo, hi) == (0, pack.shape[0]) else y[:, lo:hi] for lo, hi in self.blocks]
        if self.mode == "split":
            return [rows_linear(x, pack[lo:hi]) for lo, hi in self.blocks]
        return [rows_reference(x, pack[lo:hi]) for lo, hi in self.blocks]


class ExpertProjection:
    """Per (token, expert) slot SwiGLU over packed expert weights, each slot bit-identical to
    ``ops.swiglu(h_row, gate_e, up_e, down_e)`` (the per-request MoE).

    ``pack [E, 3 I H]`` holds per expert its ``gate_up [2I, H]`` (gate rows, then up
    rows) followed by ``down [H, I]``, so one ``index_select`` gathers both for every
    slot (while that copy is below ``gather_limit``; else each expert present gets a
    bmm over its slots with stride-0 weights). Modes (set by ``probe.probe_experts``):
    ``"fused"`` one bmm for gate and up; ``"split"`` one bmm each; ``"rows"`` per-slot
    ``ops.swiglu``. ``silu`` runs on column-slice views whose rows do not coalesce, so
    each row is one inner loop with the vector/scalar split of the per-request
    ``[1, I]`` tensor.
    """

    def __init__(self, pack: torch.Tensor, hidden: int, inter: int) -> None:
        self.pack, self.hidden, self.inter, self.mode = pack, hidden, inter, "rows"
        self.gather_limit = GATHER_LIMIT

    def views(self, pack: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gate_up [N, 2I, H], down [N, H, I])`` views of a ``[N, 3 I H]`` pack."""
        h, i = self.hidden, self.inter
        return pack[:, : 2 * i * h].view(-1, 2 * i, h), pack[:, 2 * i * h :].view(-1, h, i)

    def __call__(self, hs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """``hs [S, H]`` slot inputs, ``experts [S]`` their expert ids -> ``[S, H]``."""
        inter, hdim = self.inter, self.hidden
        if self.mode == "rows":
            gate_up, down = self.views(self.pack)
            return torch.cat([
                ops.swiglu(hs[i : i + 1], gate_up[e, :inter], gate_up[e, inter:], down[e])
                for i, e in enumerate(experts.tolist())
            ])
        s = hs.shape[0]
        if s * self.pack.shape[1] <= self.gather_limit:
            return self._slots(hs.view(s, 1, hdim), *self.views(self.pack.index_select(0, experts)))
        gate_up, down = self.views(self.pack)
        y = torch.empty((s, hdim), dtype=hs.dtype, device=hs.device)
        for e in torch.unique(experts).tolist():
            idx = (experts == e).nonzero().view(-1)
            n = idx.numel()
            y[idx] = self._slots(hs.index_select(0, idx).view(n, 1, hdim), gate_up[e].expand(n, -1, -1),
                                 down[e].expand(n, -1, -1))
        return y

    def _slots(self, hs3: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        inter = self.inter
        if self.mode == "fused":
            gu = torch.bmm(hs3, gate_up.transpose(1, 2))
            g, u = gu[:, :, :inter], gu[:, :, inter:]
        else:
            g = torch.bmm(hs3, gate_up[:, :inter].transpose(1, 2))
            u = torch.bmm(hs3, gate_up[:, inter:].transpose(1, 2))
            # a [.., :inter] view of a wider buffer keeps silu row by row, like the fused path
            g = torch.empty((g.shape[0], 1, 2 * inter), dtype=g.dtype, device=g.device)[:, :, :inter].copy_(g)
        act = F.silu(g) * u
        return torch.bmm(act, down.transpose(1, 2)).view(hs3.shape[0], self.hidden)
