"""The start-up probe: may this machine's kernels run the batched decode?

Batched decode is only used where it gives the per-request bits. The probe checks
that on the machine it runs on, with random operands (kernel choice depends on
shapes and strides, not on values, so random operands stand for the real
weights): each projection's rows equal fresh single-row ``F.linear`` (choosing
each projection's mode), expert slots equal ``ops.swiglu`` in both the gathered
and the per-expert layout, grouped decode attention equals
``ops.causal_attention`` per row, and the RoPE table equals the per-position
computation. Where anything fails, or the dtype or device was never verified,
the engine decodes request by request (with a warning), unless batched decode
was required.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from harness import ops
from harness.rollout.native.forward import Forward
from harness.rollout.native.projections import SMALL_BMM, ExpertProjection, RowProjection

log = logging.getLogger(__name__)

# Dtypes whose batched decode was verified bit-identical to the per-request path.
BATCHED_DTYPES = (torch.float32, torch.float64)


def choose_batched_decode(fwd: Forward, max_batch_size: int, requested: bool | None) -> bool:
    """``requested`` False: off. None: on where the probe passes (else a warning and off).
    True: on, or ValueError naming what is unavailable."""
    if requested is False:
        return False
    if fwd.dtype not in BATCHED_DTYPES:
        problem = f"dtype {fwd.dtype} is not one of {BATCHED_DTYPES}"
    elif fwd.device.type != "cpu":
        problem = f"device {fwd.device} (verified on CPU only)"
    else:
        problem = probe_batched_kernels(fwd, max_batch_size)
    if problem is None:
        return True
    if requested:
        raise ValueError(f"batched decode requested but unavailable: {problem}")
    log.warning("rollout engine: batched decode off, decoding request by request (%s)", problem)
    return False


@torch.no_grad()
def probe_batched_kernels(fwd: Forward, max_batch_size: int) -> str | None:
    """Run every check of the module docstring, setting each projection's mode on the
    way (layer 0's modes for every layer: same shapes); return the first problem, or None."""
    gen = torch.Generator().manual_seed(0)
    top_k = fwd.cfg.top_k
    rows = sorted({*range(1, min(max_batch_size, 16) + 1), max_batch_size})
    slots = sorted({*range(1, min(max_batch_size * top_k, 16) + 1), max_batch_size * top_k})
    layer0 = fwd.layers[0]
    projections = [layer0.qkv_proj, layer0.o_proj, layer0.router_proj, fwd.weights.lm_head_proj]
    for proj in projections:
        problem = probe_rows(proj, rows, gen)
        if problem:
            return problem
    problem = probe_experts(layer0.experts, slots, gen)
    if problem:
        return problem
    for layer in fwd.layers[1:]:  # same shapes: same modes
        for mine, first in zip((layer.qkv_proj, layer.o_proj, layer.router_proj), projections):
            mine.mode = first.mode
        layer.experts.mode = layer0.experts.mode
    problem = probe_attention(fwd, max_batch_size, gen)
    if problem:
        return problem
    d, theta = fwd.cfg.head_dim, fwd.cfg.rope_theta
    for pos in range(fwd.cfg.max_position):
        cos, sin = ops.rope_cos_sin(torch.tensor([pos], device=fwd.device), d, theta, fwd.dtype)
        if not (torch.equal(cos[0], fwd.rope_cos[pos]) and torch.equal(sin[0], fwd.rope_sin[pos])):
            return f"the RoPE table differs from the per-position computation at position {pos}"
    return None


def probe_rows(proj: RowProjection, batch_sizes: Sequence[int], gen: torch.Generator) -> str | None:
    """Set ``proj.mode`` to the first mode whose rows equal fresh single-row ``F.linear``
    for every block (on random weights of the pack's shape; the pack is restored)."""
    n, k = proj.pack.shape
    w = torch.randn(n, k, generator=gen, dtype=torch.float64).to(proj.pack.dtype)
    x = torch.randn(max(batch_sizes), k, generator=gen, dtype=torch.float64).to(proj.pack.dtype)
    want = [torch.cat([F.linear(x[i].clone().unsqueeze(0), w[lo:hi]) for i in range(x.shape[0])])
            for lo, hi in proj.blocks]
    candidates = []
    if n * k >= SMALL_BMM:
        candidates.append("fused")
    if len(proj.blocks) > 1 and all((hi - lo) * k >= SMALL_BMM for lo, hi in proj.blocks):
        candidates.append("split")
    candidates.append("rows")
    saved, proj.pack = proj.pack, w
    try:
        for mode in candidates:
            proj.mode = mode
            if all(torch.equal(got, ref[:b]) for b in batch_sizes for got, ref in zip(proj(x[:b]), want)):
                return None
        return f"no batched mode reproduces single-row [1, {k}] @ [{k}, {n}] products"
    finally:
        proj.pack = saved


def probe_experts(proj: ExpertProjection, slot_counts: Sequence[int], gen: torch.Generator) -> str | None:
    """Set ``proj.mode`` to the first mode whose slots equal ``ops.swiglu`` on fresh rows,
    for both layouts (gathered and per expert); the pack and gather limit are restored."""
    e, hdim, inter = proj.pack.shape[0], proj.hidden, proj.inter
    pack = torch.randn(proj.pack.shape, generator=gen, dtype=torch.float64).to(proj.pack.dtype)
    gu, dn = proj.views(pack)
    x = torch.randn(max(slot_counts), hdim, generator=gen, dtype=torch.float64).to(proj.pack.dtype)
    ex = torch.randint(0, e, (x.shape[0],), generator=gen)
    want = torch.cat([ops.swiglu(x[i].clone().unsqueeze(0), gu[j, :inter], gu[j, inter:], dn[j])
                      for i, j in enumerate(ex.tolist())])
    candidates = []
    if 2 * inter * hdim >= SMALL_BMM and hdim * inter >= SMALL_BMM:
        candidates += ["fused", "split"]
    candidates.append("rows")
    saved = proj.pack, proj.gather_limit
    proj.pack = pack
    try:
        for mode in candidates:
            proj.mode = mode
            ok = True
            for gather_limit in (saved[1], -1):  # the gathered and the per-expert layouts
                proj.gather_limit = gather_limit
                ok = ok and all(torch.equal(proj(x[:b], ex[:b]), want[:b]) for b in slot_counts)
            if ok:
                return None
        return f"no batched mode reproduces the per-request expert SwiGLU ([1, {hdim}] x {e} experts)"
    finally:
        proj.pack, proj.gather_limit = saved


def probe_attention(fwd: Forward, max_batch_size: int, gen: torch.Generator) -> str | None:
    """Grouped decode attention (``n * heads`` bmm items) vs ``ops.causal_attention`` per row."""
    hq, hkv, d = fwd.plan.local_heads, fwd.plan.local_kv_heads, fwd.cfg.head_dim
    dtype, max_position = fwd.dtype, fwd.cfg.max_position
    n = min(max_batch_size, 4)
    lengths = {1, 2, 24, 25, 26, 33, 64, max_position}  # both sides of the small-bmm threshold
    for length in sorted(n for n in lengths if n <= max_position):
        q = torch.randn(n, 1, hq, d, generator=gen, dtype=torch.float64).to(dtype)
        k = torch.randn(n, length, hkv, d, generator=gen, dtype=torch.float64).to(dtype)
        v = torch.randn(n, length, hkv, d, generator=gen, dtype=torch.float64).to(dtype)
        pos, kpos = torch.tensor([length - 1]), torch.arange(length)
        want = torch.cat([ops.causal_attention(q[i : i + 1], k[i : i + 1].clone(), v[i : i + 1].clone(), pos, kpos)
                          for i in range(n)]).reshape(n, hq * d)
        kh = k.transpose(1, 2)[:, fwd.kv_head_of_q].contiguous()
        vh = v.transpose(1, 2)[:, fwd.kv_head_of_q].contiguous()
        got = fwd.grouped_attention(q.reshape(n, hq, d), kh, vh)
        if not torch.equal(got, want):
            return f"grouped decode attention differs from the per-request one at length {length}"
    return None
