"""The start-up probe: may this machine's kernels run the batched decode?

Batched decode is only used where it gives the per-request bits. The probe checks
that on the machine it runs on, with random operands (kernel choice depends on
shapes and strides, not on values, so random operands stand for the real
weights): each projection's rows equal fresh single-row ``F.linear`` (choosing
each projection's mode), expert slots equal ``ops.swiglu`` in both the gathered
and the per-expert layout, grouped decode attention equals
``ops.causal_attention`` per row, and the RoPE table equals the per-position
computation. Where anything fails, or the dtype was never verified, the engine
decodes request by request (with a warning that names the reason), unless
batched decode was required.

On a GPU the row-local reductions (RMSNorm's mean, softmax, the sampler's
log-softmax and cumsum) are kernels chosen by shape as well, so there the probe
also decodes one step of real rows both ways end to end (``probe_decode``: the
batched logits of every row equal its per-request logits, for several batch
compositions, on the engine's own weights) and checks the batched sampler
against ``sample_token`` per row (``probe_sampling``; where only that fails, the
batched logits are sampled row by row). Where the batched attention, the RoPE
table or the end-to-end check fail on a GPU, the row-local decode
(``Forward.row_local``: GEMMs batched, every reduction and the attention per row
on the per-request shapes) is checked end to end instead; only if that fails too
does the engine decode request by request. (With ``decode_kernels="invariant"`` none
of the above decides: ``probe_invariant`` checks a batched step against each row's own
batch of one on the same kernels.) On the CPU these hold by construction
(the per-kernel checks above and the unit tests) and are not run, so a CPU
engine's start dispatches exactly the operators it did before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from harness import ops
from harness.devices import moved
from harness.rollout.native.forward import DecodeBatch, Forward
from harness.rollout.native.projections import SMALL_BMM, ExpertProjection, RowProjection
from harness.rollout.native.sampling import sample_rows, sample_token

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
    elif fwd.device.type == "cpu":
        problem = probe_batched_kernels(fwd, max_batch_size)
    else:
        problem = _probe_device(fwd, max_batch_size)
    if problem is None:
        return True
    if requested:
        raise ValueError(f"batched decode requested but unavailable on {fwd.device}: {problem}")
    log.warning("rollout engine on %s: batched decode off, decoding request by request (%s)", fwd.device, problem)
    return False


def _probe_device(fwd: Forward, max_batch_size: int) -> str | None:
    """A GPU: the per-kernel checks, then ``probe_decode`` end to end; where the batched
    attention, RoPE table or reductions do not hold, the row-local decode
    (``Forward.row_local``) is tried end to end before giving up."""
    problem = probe_batched_kernels(fwd, max_batch_size, projections_only=True)
    if problem is not None:
        return problem
    if probe_batched_kernels(fwd, max_batch_size) is None and probe_decode(fwd, max_batch_size) is None:
        return None
    fwd.row_local = True
    problem = probe_decode(fwd, max_batch_size)
    if problem is not None:
        fwd.row_local = False
        return f"row-local decode: {problem}"
    log.info("rollout engine on %s: batched decode with per-row reductions and attention (row_local)", fwd.device)
    return None


def choose_batched_sampling(device: torch.device, vocab: int) -> bool:
    """Whether ``sample_rows`` may sample a batched decode's rows together: always on the
    CPU (``sample_rows`` is built for its kernels); elsewhere when ``probe_sampling``
    passes, else the rows are sampled one by one (a warning names the reason)."""
    if device.type == "cpu":
        return True
    problem = probe_sampling(device, vocab)
    if problem is not None:
        log.warning("rollout engine on %s: batched sampling off, sampling row by row (%s)", device, problem)
    return problem is None


@torch.no_grad()
def probe_batched_kernels(fwd: Forward, max_batch_size: int, projections_only: bool = False) -> str | None:
    """Run every check of the module docstring, setting each projection's mode on the
    way (layer 0's modes for every layer: same shapes); return the first problem, or None.
    ``projections_only``: stop after the projections and experts (what row-local decode needs)."""
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
    if projections_only:
        return None
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
    dev = proj.pack.device
    w = moved(torch.randn(n, k, generator=gen, dtype=torch.float64).to(proj.pack.dtype), dev)
    x = moved(torch.randn(max(batch_sizes), k, generator=gen, dtype=torch.float64).to(proj.pack.dtype), dev)
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
    dev = proj.pack.device
    pack = moved(torch.randn(proj.pack.shape, generator=gen, dtype=torch.float64).to(proj.pack.dtype), dev)
    gu, dn = proj.views(pack)
    x = moved(torch.randn(max(slot_counts), hdim, generator=gen, dtype=torch.float64).to(proj.pack.dtype), dev)
    ex = moved(torch.randint(0, e, (x.shape[0],), generator=gen), dev)
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
        dev = fwd.device
        q = moved(torch.randn(n, 1, hq, d, generator=gen, dtype=torch.float64).to(dtype), dev)
        k = moved(torch.randn(n, length, hkv, d, generator=gen, dtype=torch.float64).to(dtype), dev)
        v = moved(torch.randn(n, length, hkv, d, generator=gen, dtype=torch.float64).to(dtype), dev)
        pos, kpos = moved(torch.tensor([length - 1]), dev), moved(torch.arange(length), dev)
        want = torch.cat([ops.causal_attention(q[i : i + 1], k[i : i + 1].clone(), v[i : i + 1].clone(), pos, kpos)
                          for i in range(n)]).reshape(n, hq * d)
        kh = k.transpose(1, 2)[:, fwd.kv_head_of_q].contiguous()
        vh = v.transpose(1, 2)[:, fwd.kv_head_of_q].contiguous()
        got = fwd.grouped_attention(q.reshape(n, hq, d), kh, vh)
        if not torch.equal(got, want):
            return f"grouped decode attention differs from the per-request one at length {length}"
    return None


class _ProbeRow:
    """A decode row of the end-to-end probe (``forward.DecodeRow``)."""

    def __init__(self, slot: int, tokens: list[int]) -> None:
        self.slot, self.tokens, self.cached = slot, tokens, len(tokens) - 1


def choose_invariant(fwd: Forward, max_batch_size: int, requested: bool) -> bool:
    """The invariant decode kernels (``invariant``): on where ``probe_invariant`` passes (it sets
    ``fwd.kernels``). ``requested`` True (``decode_kernels="invariant"``): a failing probe is a
    ValueError naming the reason; False (a caller that falls back): a warning, and False."""
    problem = probe_invariant(fwd, max_batch_size)
    if problem is None:
        log.info("rollout engine on %s: batched decode on the batch-invariant kernels", fwd.device)
        return True
    if requested:
        raise ValueError(f"invariant decode kernels requested but unavailable on {fwd.device}: {problem}")
    log.warning("rollout engine on %s: invariant decode kernels off (%s)", fwd.device, problem)
    return False


def probe_invariant(fwd: Forward, max_batch_size: int) -> str | None:
    """Whether the invariant kernels hold on this machine: ``probe_decode`` with each row's
    reference its own batch of one on the same kernels (the guarantee itself). Sets
    ``fwd.kernels`` to ``"invariant"`` on success, back to ``"standard"`` otherwise; on cuda
    it also tries the per-request MoE as grouped GEMMs (``fwd.grouped_prefill``)."""
    from harness.rollout.native.invariant import INVARIANT_DTYPES

    if fwd.dtype not in INVARIANT_DTYPES:
        return f"dtype {fwd.dtype} is not one of {INVARIANT_DTYPES}"
    fwd.kernels = "invariant"
    fwd.grouped_prefill = fwd.device.type == "cuda" and grouped_fp_ok(fwd)
    problem = probe_decode(fwd, max_batch_size, alone=lambda row: fwd.step([], DecodeBatch.build(fwd, [row]))[0][0])
    if problem is not None:
        fwd.kernels, fwd.grouped_prefill = "standard", False
    return problem


def grouped_fp_ok(fwd: Forward) -> bool:
    """Whether ``torch._grouped_mm`` runs this dtype here (its result agrees with the loop to
    rounding; prefill is per request, so any deterministic kernel keeps the guarantee)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    x = torch.ones(4, 8, dtype=fwd.dtype, device=fwd.device)
    w = torch.ones(2, 8, 16, dtype=fwd.dtype, device=fwd.device)
    try:
        y = torch._grouped_mm(x, w, offs=torch.tensor([1, 4], dtype=torch.int32, device=fwd.device))
    except (RuntimeError, NotImplementedError) as exc:
        log.info("rollout engine on %s: no grouped GEMM for %s (%s)", fwd.device, fwd.dtype, str(exc)[:120])
        return False
    return bool(torch.all(y == 8))


def probe_decode(fwd: Forward, max_batch_size: int,
                 alone: Callable[[_ProbeRow], torch.Tensor] | None = None) -> str | None:
    """One decode step of real rows, batched and per request, on the engine's weights.

    For each batch size ``n`` (2, 3, 5, 8, 16 and ``max_batch_size``, where they fit):
    ``n`` requests of different lengths are prefilled (per request, as the engine
    does), their next token is decoded as one ``DecodeBatch`` and again per request
    (``Forward.step`` with the one new token); every row's logits must be equal bit
    for bit. A row's own tokens are the same in every batch it appears in, so this
    also checks that a row does not depend on its neighbours. Frees every slot it
    takes. Returns the first problem, or None. ``alone``: a row's reference logits
    (default: the per-request step of its one new token).
    """
    gen = torch.Generator().manual_seed(1)
    room = min(fwd.cfg.max_position - 1, 40)
    sizes = sorted({n for n in (2, 3, 5, 8, 16, max_batch_size) if 2 <= n <= max_batch_size})
    for n in sizes:
        lengths = [1 + (7 * i + 3) % room for i in range(n)]
        slots = [fwd.kv.allocate() for _ in range(n)]
        try:
            rows = []
            for slot, length in zip(slots, lengths):
                tokens = torch.randint(0, fwd.cfg.vocab, (length + 1,), generator=gen).tolist()
                fwd.step([(slot, 0, tokens[:-1])])
                rows.append(_ProbeRow(slot, tokens))
            batch = DecodeBatch.build(fwd, rows)
            batched, _ = fwd.step([], batch)
            for i, row in enumerate(batch.seqs):
                if alone is None:
                    ref = fwd.step([(row.slot, row.cached, row.tokens[-1:])])[1][0][-1]
                else:
                    ref = alone(row)
                if not torch.equal(batched[i], ref):
                    return (f"batched decode logits differ from the per-request ones (batch of {n}, a row "
                            f"with {row.cached} cached positions; max |diff| "
                            f"{float((batched[i] - ref).abs().max()):.3g})")
        finally:
            for slot in slots:
                fwd.kv.release(slot)
    return None


@torch.no_grad()
def probe_sampling(device: torch.device, vocab: int) -> str | None:
    """``sample_rows`` against ``sample_token`` per row on random logits on ``device``
    (greedy and temperature rows, batch sizes 2..16 and 64); the first problem, or None."""
    gen = torch.Generator().manual_seed(2)
    for n in (2, 3, 5, 8, 16, 64):
        logits = moved(torch.randn(n, vocab, generator=gen, dtype=torch.float64).to(torch.float32) * 4, device)
        for temperature in (0.0, 1.0, 0.7):
            temps, tops = [temperature] * n, [1.0] * n
            got = sample_rows(logits, temperatures=temps, top_ps=tops,
                              generators=[torch.Generator().manual_seed(i) for i in range(n)])
            want = [sample_token(logits[i], temperature=temperature, top_p=1.0,
                                 generator=torch.Generator().manual_seed(i)) for i in range(n)]
            if list(zip(*got)) != want:
                return f"sample_rows differs from sample_token per row (batch of {n}, temperature {temperature})"
    return None
