"""Batch-invariant decode kernels: every reduction in a fixed order that does not depend
on the batch, built from exactly rounded element-wise ops.

A GPU reduction kernel (``sum``, ``mean``, ``softmax``, a GEMM's inner product) picks
its blocking by shape, so a row reduced inside a ``[B, N]`` tensor need not give the
bits of the same row reduced alone. ``fold_sum`` does not use one: it pads the axis
with zeros to the next power of two and adds the upper half onto the lower half until
one element is left (a pairwise tree). Every add is an element-wise kernel, exact per
element whatever the tensor's shape, so a row's sum depends only on the row. And a
row padded with more zeros (a longer row in the same batch, up to any larger power of
two) folds to the same bits: each extra halving adds zeros onto the row's own
elements (``x + 0 == x``; only a ``-0.0`` may become ``+0.0``, equal as a value).

On this the decode step is built (``Forward`` with ``kernels == "invariant"``):
RMSNorm, the q/k norms, attention (``q . k`` as a product and ``fold_sum`` over the
head dimension; softmax with ``amax``, which is exact in any order, and a folded
denominator; ``sum_j p_j v_j`` folded over the positions, each row masked beyond its
own length so a row sees zeros there), and the router's softmax. The matrix products
too (``linear``, ``expert_swiglu``): each dot product is an element-wise product
folded over the inner dimension, so no GEMM kernel is chosen by the batch's shape
(a cuBLAS GEMM may pick another kernel, or split the inner dimension, for another
row count). So a request's decode rows have the same bits in a batch of one and in
any batch: the guarantee holds by construction, and the start-up probe checks it on
the device (``probe.probe_invariant``). The cost is memory traffic (the product
tensor is ``rows x N x K``), which at decode's few rows is far below a launch-bound
per-row loop.

These are different kernels from ``harness.ops`` (the reference model and the
per-request path): the results agree to rounding, not bit for bit. float32, float64
and bfloat16; bfloat16 operands are accumulated in float32 (``accumulate``: every
product and fold runs in float32 on the exactly widened operands, the weights stay
bfloat16 in memory) and each kernel's result is rounded back to bfloat16 once, an
element-wise cast, so the guarantee holds as in float32. float16 is refused.
"""

from __future__ import annotations

import torch

INVARIANT_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
# Storage dtype -> the dtype its products and folds are computed in.
ACCUMULATE = {torch.bfloat16: torch.float32}


def accumulate(x: torch.Tensor) -> torch.Tensor:
    """``x`` widened to its accumulation dtype (``ACCUMULATE``; exact), or ``x`` itself."""
    acc = ACCUMULATE.get(x.dtype)
    return x if acc is None else x.to(acc)


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (``n >= 1``)."""
    return 1 << (n - 1).bit_length()


def fold_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum over ``dim`` (kept, size 1) as a pairwise tree over the zero-padded power-of-two
    length: the same bits for a row alone and in any batch, and for any extra zero padding."""
    dim = dim % x.dim()
    n = x.shape[dim]
    p = next_pow2(n)
    if p != n:
        pad = list(x.shape)
        pad[dim] = p - n
        x = torch.cat((x, x.new_zeros(pad)), dim=dim)
    while p > 1:
        p //= 2
        x = x.narrow(dim, 0, p) + x.narrow(dim, p, p)
    return x


# Largest product tensor (elements) ``linear`` and ``expert_swiglu`` build at once; more rows
# run in chunks (each row's result is its own, so chunking never changes a bit).
PRODUCT_ELEMENTS = 1 << 28


def _row_chunks(rows: int, per_row: int) -> list[tuple[int, int]]:
    step = max(1, PRODUCT_ELEMENTS // max(per_row, 1))
    return [(lo, min(lo + step, rows)) for lo in range(0, rows, step)]


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [B, K] @ w [N, K]^T -> [B, N]``, each dot product an element-wise product and a
    ``fold_sum`` over ``K``: a row's bits depend only on the row (no GEMM kernel choice)."""
    n, k = w.shape
    xa = accumulate(x)  # bf16: fp32 products (w widened element by element), one rounding at the end
    outs = [fold_sum(xa[lo:hi].unsqueeze(1) * w.unsqueeze(0)).squeeze(-1) for lo, hi in _row_chunks(x.shape[0], n * k)]
    return (outs[0] if len(outs) == 1 else torch.cat(outs)).to(x.dtype)


def expert_swiglu(hs: torch.Tensor, experts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Per slot ``s``: ``ops.swiglu(hs[s], gate, up, down)`` of expert ``experts[s]`` over the
    ``[E, 2I, H]`` / ``[E, H, I]`` expert weights, every product folded (``linear``'s rule)."""
    inter = down.shape[2]
    ha = accumulate(hs)
    outs = []
    for lo, hi in _row_chunks(hs.shape[0], gate_up.shape[1] * gate_up.shape[2]):
        ex = experts[lo:hi]
        gu = fold_sum(_times(gate_up.index_select(0, ex), ha[lo:hi].unsqueeze(1))).squeeze(-1)  # [S, 2I]
        act = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        outs.append(fold_sum(_times(down.index_select(0, ex), act.unsqueeze(1))).squeeze(-1))  # [S, H]
    return (outs[0] if len(outs) == 1 else torch.cat(outs)).to(hs.dtype)


def _times(gathered: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``gathered * x`` in ``x``'s dtype: in place when the dtypes agree (no second copy of the
    gathered weights), else a widened product (bf16 weights times fp32 activations)."""
    return gathered.mul_(x) if gathered.dtype == x.dtype else gathered * x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x^2) + eps))`` over the last dim, the mean folded (bf16: in fp32)."""
    xa = accumulate(x)
    var = fold_sum(xa * xa) / x.shape[-1]
    return (weight * (xa * torch.rsqrt(var + eps))).to(x.dtype)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim (``-inf`` entries give exact zeros; one must be finite)."""
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / fold_sum(e)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """One-token queries ``q [B, Hkv, G, D]`` (``G`` query heads per KV head) over cached
    ``k, v [B, Hkv, L, D]``, row ``b`` seeing its first ``lengths[b]`` positions: ``[B, Hkv * G * D]``.

    A row's bits do not depend on ``L`` (the batch's longest row) or on the other rows.
    """
    b, _, _, d = q.shape
    length = k.shape[2]
    qa = accumulate(q)  # bf16: scores, softmax and the weighted sum in fp32
    scores = fold_sum(qa.unsqueeze(3) * k.unsqueeze(2)).squeeze(-1) * (d**-0.5)  # [B, Hkv, G, L]
    hidden = torch.arange(length, device=q.device).view(1, -1) >= lengths.view(-1, 1)  # [B, L]
    scores = scores.masked_fill(hidden.view(b, 1, 1, length), float("-inf"))
    probs = softmax(scores)
    out = fold_sum(probs.unsqueeze(-1) * v.unsqueeze(2), dim=3)  # [B, Hkv, G, 1, D]
    return out.reshape(b, -1).to(q.dtype)


def route(router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``ops.route``'s ``(weights [B, k], indices [B, k])`` with the softmax and the
    renormalisation folded (top-k selects values, exact in any order)."""
    probs = softmax(router_logits.to(torch.float32))
    weights, indices = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / fold_sum(weights)
    return weights.to(router_logits.dtype), indices
