"""The native generation engine: KV cache, continuous batching, seeded sampling, TP.

An ``Engine`` is the inference twin of the reference Qwen3-MoE (as vLLM is to
Megatron): a separate implementation over a dict of HF-named tensors that
reuses ``harness.model.functional`` so both stacks compute the same math.

Batch invariance (a request's tokens and logprobs never depend on what else
is in the batch, on ``max_batch_size`` or on its KV slot) rests on one rule:
*every floating-point result of a request is computed by the same kernel, on
operands of the same shape and layout, whatever else is in the step.* CPU BLAS
picks different kernels for different row counts (a ``[B, K] @ [K, N]`` GEMM
with ``B > 1`` does not reproduce the ``B = 1`` rows), so rows are never
stacked into one GEMM. Two paths honour the rule:

* **Prefill** (and ``prompt_logprobs``): each request runs alone with its own
  shapes (``[1, P]``), exactly the reference model's computation.
* **Batched decode** (the default where the start-up probe passes): the
  running requests' one-token rows go through each layer together, but every
  matrix product is a ``torch.bmm`` whose batch items are the rows: item ``i``
  is a ``[1, K] @ [K, N]`` product with the weight as a stride-0 expanded,
  transposed view, which ATen hands to BLAS item by item (``gemm_batched``):
  the same GEMM, bit for bit, as ``F.linear`` of that row alone (the
  per-request path). Products with ``K * N < 400`` would take ATen's naive
  small-``bmm`` kernel instead, so they run per row with ``F.linear`` (zero
  padding to a wider ``N`` does not help: MKL's ``M = 1`` results can depend
  on the output width). Attention groups the rows by cache length and runs
  the per-request attention shapes (``[1, D] @ [D, L]`` per head, softmax,
  ``[1, L] @ [L, D]``) as bmm items. Element-wise ops are per element; the
  transcendental one whose vector and scalar code paths differ in the last
  bits (``silu``) runs on views whose rows do not coalesce, so each row is one
  inner loop exactly as when it ran alone; reductions (RMSNorm's mean,
  softmax, top-k, log-softmax, cumsum) are row-local. MoE experts are applied
  per (token, expert) slot as bmm items over gathered expert weights, and a
  token's slot outputs are summed in expert-id order, as the per-request
  dispatch does. The result: batched decode is bit-identical to the
  per-request decode (``batched_decode=False``), which is batch-invariant by
  construction. ``_probe_batched_kernels`` checks the kernel-level claims on
  this machine at start-up with random operands (each projection's mode, the
  expert SwiGLU, grouped attention, the RoPE table) and falls back to
  per-request decode, with a warning, if they do not hold.
* **Prefill dedup**: identical prompts admitted in one step (a GRPO group)
  are prefilled once; the others copy the KV prefix and sample (with their
  own generators) from the same logits: the same computation, the same bits.

The batch is the unit of scheduling and of communication: with TP > 1 one
collective per layer and sub-layer carries every request's rows of the step.
That collective is an ``all_gather`` followed by a sum in rank order (not an
``all_reduce``, whose ring chunking makes an element's summation order depend
on the tensor size), so the reduced rows are bitwise identical on every TP
rank and for every batch composition. Every TP rank therefore samples the
same tokens.

Scheduling (``generate``): requests are admitted in order while slots are
free; each step prefills the newly admitted requests and decodes one token
for the running ones; finished requests free their slot at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.model import functional as Fn
from harness.model.config import ModelConfig
from harness.rollout.kv_cache import KVCachePool
from harness.rollout.requests import make_result, validate_request
from harness.rollout.sampling import sample_rows, sample_token
from harness.rollout.sharding import ShardPlan, hf_weight_shapes

log = logging.getLogger(__name__)

# ATen's CPU bmm uses a naive kernel for batch items with K * M * N below this
# (aten/src/ATen/native/LinearAlgebra.cpp); above it, BLAS per item.
_SMALL_BMM = 400
# Dtypes whose batched decode was verified bit-identical to the per-request path.
_BATCHED_DTYPES = (torch.float32, torch.float64)
# Gather expert weights per slot while the copy stays below this many elements
# per layer; beyond it, loop over the experts present with expanded weights.
_GATHER_LIMIT = 1 << 21


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    """``all_gather`` into a flat ``[tp * N, ...]`` output (``all_gather_single`` when available)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp, group=group)


def as_model_config(model_cfg: ModelConfig | Mapping[str, Any]) -> ModelConfig:
    """Accept a ``ModelConfig``, a spec ``model`` block or a whole spec dict."""
    if isinstance(model_cfg, ModelConfig):
        return model_cfg
    return ModelConfig.from_spec(model_cfg)


def rows_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``[B, K] x [N, K]^T -> [B, N]`` as one bmm whose items are the rows.

    Item ``i`` is the ``[1, K] @ [K, N]`` product with the weight as a
    stride-0 expanded, transposed view: ATen hands it to BLAS item by item,
    the call ``F.linear(x[i:i+1], w)`` makes (``_RowProjection`` verifies that
    on this machine before relying on it). ``w`` must be contiguous.
    """
    b, k = x.shape
    return torch.bmm(x.contiguous().view(b, 1, k), w.t().expand(b, k, w.shape[0])).view(b, w.shape[0])


def _rows_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The per-request computation: ``F.linear`` of each row alone."""
    return torch.cat([F.linear(x[i : i + 1], w) for i in range(x.shape[0])])


class _RowProjection:
    """``x [B, K] -> [B, N_j]`` per column block ``j`` of a packed weight ``[N, K]``, each row
    bit-identical to ``F.linear(row, block_j)`` (the per-request path).

    ``mode`` (set by ``probe``): ``"fused"`` one bmm over the pack, blocks sliced off;
    ``"split"`` one bmm per block; ``"rows"`` ``F.linear`` per row (small products,
    ``K * N < 400``, which ATen's bmm hands to a naive kernel, or BLAS builds whose
    results depend on the output width).
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
        return [_rows_reference(x, pack[lo:hi]) for lo, hi in self.blocks]

    def probe(self, batch_sizes: Sequence[int], gen: torch.Generator) -> str | None:
        """Pick the first mode whose rows equal fresh single-row ``F.linear`` for every block."""
        n, k = self.pack.shape
        w = torch.randn(n, k, generator=gen, dtype=torch.float64).to(self.pack.dtype)
        x = torch.randn(max(batch_sizes), k, generator=gen, dtype=torch.float64).to(self.pack.dtype)
        want = [torch.cat([F.linear(x[i].clone().unsqueeze(0), w[lo:hi]) for i in range(x.shape[0])])
                for lo, hi in self.blocks]
        candidates = []
        if n * k >= _SMALL_BMM:
            candidates.append("fused")
        if len(self.blocks) > 1 and all((hi - lo) * k >= _SMALL_BMM for lo, hi in self.blocks):
            candidates.append("split")
        candidates.append("rows")
        saved, self.pack = self.pack, w
        try:
            for mode in candidates:
                self.mode = mode
                if all(torch.equal(got, ref[:b]) for b in batch_sizes for got, ref in zip(self(x[:b]), want)):
                    return None
            return f"no batched mode reproduces single-row [1, {k}] @ [{k}, {n}] products"
        finally:
            self.pack = saved


class _ExpertProjection:
    """Per (token, expert) slot SwiGLU over packed expert weights, each slot bit-identical to
    ``Fn.swiglu(h_row, gate_e, up_e, down_e)`` (the per-request MoE).

    ``pack [E, 3 I H]`` holds per expert its ``gate_up [2I, H]`` (gate rows, then up
    rows) followed by ``down [H, I]``, so one ``index_select`` gathers both for every
    slot (while that copy is small; else each expert present gets a bmm over its
    slots with stride-0 weights). Modes: ``"fused"`` one bmm for gate and up;
    ``"split"`` one bmm each; ``"rows"`` per-slot ``Fn.swiglu``. ``silu`` runs on
    column-slice views whose rows do not coalesce, so each row is one inner loop with
    the vector/scalar split of the per-request ``[1, I]`` tensor.
    """

    def __init__(self, pack: torch.Tensor, hidden: int, inter: int) -> None:
        self.pack, self.hidden, self.inter, self.mode = pack, hidden, inter, "rows"
        self.gather_limit = _GATHER_LIMIT

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
                Fn.swiglu(hs[i : i + 1], gate_up[e, :inter], gate_up[e, inter:], down[e])
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

    def probe(self, slot_counts: Sequence[int], gen: torch.Generator) -> str | None:
        """Pick the first mode whose slots equal ``Fn.swiglu`` on fresh rows, for both layouts."""
        e, hdim, inter = self.pack.shape[0], self.hidden, self.inter
        pack = torch.randn(self.pack.shape, generator=gen, dtype=torch.float64).to(self.pack.dtype)
        gu, dn = self.views(pack)
        x = torch.randn(max(slot_counts), hdim, generator=gen, dtype=torch.float64).to(self.pack.dtype)
        ex = torch.randint(0, e, (x.shape[0],), generator=gen)
        want = torch.cat([Fn.swiglu(x[i].clone().unsqueeze(0), gu[j, :inter], gu[j, inter:], dn[j])
                          for i, j in enumerate(ex.tolist())])
        candidates = []
        if 2 * inter * hdim >= _SMALL_BMM and hdim * inter >= _SMALL_BMM:
            candidates += ["fused", "split"]
        candidates.append("rows")
        saved = self.pack, self.gather_limit
        self.pack = pack
        try:
            for mode in candidates:
                self.mode = mode
                ok = True
                for gather_limit in (saved[1], -1):  # the gathered and the per-expert layouts
                    self.gather_limit = gather_limit
                    ok = ok and all(torch.equal(self(x[:b], ex[:b]), want[:b]) for b in slot_counts)
                if ok:
                    return None
            return f"no batched mode reproduces the per-request expert SwiGLU ([1, {hdim}] x {e} experts)"
        finally:
            self.pack, self.gather_limit = saved


@dataclass
class _Sequence:
    """One running request: its slot, generator and what it produced so far."""

    request: Mapping[str, Any]
    slot: int
    generator: torch.Generator
    max_new: int
    tokens: list[int]
    temperature: float = 1.0
    top_p: float = 1.0
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cached: int = 0  # positions already in the KV cache
    finish_reason: str | None = None


@dataclass
class _Layer:
    """One layer's packed tensors (the HF-named parameters are views into them) and the
    batched-decode projections over them."""

    input_norm: torch.Tensor
    qkv: torch.Tensor  # [q_width + 2 kv_width, H]
    qk_norm: torch.Tensor | None  # [local_heads + local_kv_heads, D]: q_norm per q head, k_norm per k head
    o: torch.Tensor  # [H, q_width]
    post_norm: torch.Tensor
    router: torch.Tensor  # [E, H]
    experts_pack: torch.Tensor  # [E, 3 I H]: per expert gate rows, up rows ([2I, H]), then down [H, I]
    qkv_proj: _RowProjection
    o_proj: _RowProjection
    router_proj: _RowProjection
    experts: _ExpertProjection


class Engine:
    """Generation over HF-named weights with optional tensor parallelism.

    ``weights`` are *full* tensors (the engine keeps its TP shard); ``None``
    allocates zeros, to be filled by ``load_weights`` (a refit). With
    ``tp_size > 1`` every TP rank constructs an engine with its ``tp_rank``
    and the same ``tp_group`` and calls every method collectively.

    ``batched_decode``: ``None`` (default) decodes the running requests
    together when the start-up probe confirms this machine's kernels give the
    per-request bits (see the module docstring); ``False`` forces the
    per-request decode; ``True`` requires the batched one (ValueError if the
    dtype is not supported or the probe fails). Either way the tokens and
    logprobs are the same.
    """

    def __init__(
        self,
        model_cfg: ModelConfig | Mapping[str, Any],
        weights: Mapping[str, torch.Tensor] | None,
        *,
        tp_rank: int = 0,
        tp_size: int = 1,
        tp_group: Any = None,
        max_batch_size: int = 8,
        device: str | torch.device = "cpu",
        eos_token_id: int | None = None,
        batched_decode: bool | None = None,
    ) -> None:
        self.cfg = as_model_config(model_cfg)
        if max_batch_size < 1:
            raise ValueError(f"rollout.max_batch_size must be >= 1, got {max_batch_size}")
        if tp_size > 1 and tp_group is None:
            raise ValueError("an engine with tp_size > 1 needs its tp_group")
        self.plan = ShardPlan(self.cfg, tp_rank, tp_size)
        self.tp_group = tp_group
        self.device = torch.device(device)
        self.dtype = self.cfg.torch_dtype()
        self.max_batch_size = max_batch_size
        self.eos_token_id = eos_token_id
        self.weight_version = 0
        self._full_shapes = hf_weight_shapes(self.cfg)
        self._allocate_params()
        self.kv = KVCachePool(
            layers=self.cfg.layers,
            slots=max_batch_size,
            max_position=self.cfg.max_position,
            kv_heads=self.plan.local_kv_heads,
            head_dim=self.cfg.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        self._build_tables()
        if weights is not None:
            missing = [n for n in self._full_shapes if n not in weights]
            if missing:
                raise ValueError(f"engine weights are missing {len(missing)} tensor(s), first: {missing[:3]}")
            self.load_weights(weights.items())
        self.batched_decode = self._choose_batched_decode(batched_decode)

    # -- parameters ------------------------------------------------------------

    def _allocate_params(self) -> None:
        """Packed tensors per layer, with every HF-named parameter a view into them.

        ``load_weights`` copies into the views, so the packs (which the batched
        decode reads) and ``params`` (which prefill and ``state_dict`` read)
        never disagree. Values are the same either way; only storage differs.
        """
        cfg, plan, dt, dev = self.cfg, self.plan, self.dtype, self.device
        h, d, e = cfg.hidden, cfg.head_dim, cfg.experts
        qw, kvw = plan.local_heads * d, plan.local_kv_heads * d
        inter = cfg.moe_intermediate // plan.tp_size

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=dt, device=dev)

        params: dict[str, torch.Tensor] = {}
        layers: list[_Layer] = []
        params["model.embed_tokens.weight"] = zeros(cfg.vocab, h)
        for i in range(cfg.layers):
            p = f"model.layers.{i}"
            qkv, o, router = zeros(qw + 2 * kvw, h), zeros(h, qw), zeros(e, h)
            experts = _ExpertProjection(zeros(e, 3 * inter * h), h, inter)
            gate_up, down = experts.views(experts.pack)
            layer = _Layer(
                input_norm=zeros(h),
                qkv=qkv,
                qk_norm=zeros(plan.local_heads + plan.local_kv_heads, d) if cfg.qk_norm else None,
                o=o,
                post_norm=zeros(h),
                router=router,
                experts_pack=experts.pack,
                qkv_proj=_RowProjection(qkv, [(0, qw), (qw, qw + kvw), (qw + kvw, qw + 2 * kvw)]),
                o_proj=_RowProjection(o, [(0, h)]),
                router_proj=_RowProjection(router, [(0, e)]),
                experts=experts,
            )
            layers.append(layer)
            params[f"{p}.input_layernorm.weight"] = layer.input_norm
            params[f"{p}.self_attn.q_proj.weight"] = qkv[:qw]
            params[f"{p}.self_attn.k_proj.weight"] = qkv[qw : qw + kvw]
            params[f"{p}.self_attn.v_proj.weight"] = qkv[qw + kvw :]
            params[f"{p}.self_attn.o_proj.weight"] = o
            if cfg.qk_norm:
                # Their own tensors; load_weights refreshes the per-head rows of qk_norm.
                params[f"{p}.self_attn.q_norm.weight"] = zeros(d)
                params[f"{p}.self_attn.k_norm.weight"] = zeros(d)
            params[f"{p}.post_attention_layernorm.weight"] = layer.post_norm
            params[f"{p}.mlp.gate.weight"] = router
            for x in range(e):
                params[f"{p}.mlp.experts.{x}.gate_proj.weight"] = gate_up[x, :inter]
                params[f"{p}.mlp.experts.{x}.up_proj.weight"] = gate_up[x, inter:]
                params[f"{p}.mlp.experts.{x}.down_proj.weight"] = down[x]
        params["model.norm.weight"] = zeros(h)
        params["lm_head.weight"] = zeros(cfg.vocab, h)
        for name, shape in self._full_shapes.items():
            want = self.plan.local_shape(name, shape)
            if tuple(params[name].shape) != want or not params[name].is_contiguous():
                raise AssertionError(
                    f"engine parameter layout broken for {name}: {tuple(params[name].shape)} vs {want}"
                )
        self.params = {name: params[name] for name in self._full_shapes}  # model order
        self._layers = layers
        self._lm_head_proj = _RowProjection(params["lm_head.weight"], [(0, cfg.vocab)])

    def _build_tables(self) -> None:
        cfg = self.cfg
        positions = torch.arange(cfg.max_position, device=self.device)
        cos, sin = Fn.rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, self.dtype)
        half = cfg.head_dim // 2
        # rotate_half(x) * sin == roll(x, half) * [-sin_1, sin_2] exactly (negation is exact).
        self._rope_cos = cos.contiguous()
        self._rope_sin = sin.contiguous()
        self._rope_sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).contiguous()
        self._kv_head_of_q = torch.arange(self.plan.local_heads, device=self.device) // (
            self.plan.local_heads // self.plan.local_kv_heads
        )

    # -- weights ---------------------------------------------------------------

    def state_dict_info(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Full (unsharded) ``(shape, dtype)`` per HF name: what a refit must send."""
        return {name: (shape, self.dtype) for name, shape in self._full_shapes.items()}

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """Copy full tensors into this rank's shards; return the names loaded.

        Unknown names, wrong shapes or dtypes raise ValueError naming the tensor.
        The copy is exact (same dtype), so refit preserves bits.
        """
        loaded = []
        for name, full in named_tensors:
            if name not in self._full_shapes:
                raise ValueError(f"engine has no parameter named {name!r}")
            if tuple(full.shape) != self._full_shapes[name]:
                raise ValueError(f"{name}: shape {tuple(full.shape)}, engine expects {self._full_shapes[name]}")
            if full.dtype != self.dtype:
                raise ValueError(f"{name}: dtype {full.dtype}, engine expects {self.dtype}")
            with torch.no_grad():
                self.params[name].copy_(self.plan.shard(name, full))
                if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
                    self._refresh_qk_norm(int(name.split(".")[2]))
            loaded.append(name)
        return loaded

    def _refresh_qk_norm(self, layer: int) -> None:
        p, heads = f"model.layers.{layer}.self_attn", self.plan.local_heads
        packed = self._layers[layer].qk_norm
        packed[:heads].copy_(self.params[f"{p}.q_norm.weight"].expand(heads, -1))
        packed[heads:].copy_(self.params[f"{p}.k_norm.weight"].expand(packed.shape[0] - heads, -1))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's shards under HF names (``ShardPlan.unshard`` rebuilds full tensors)."""
        return {name: t.detach().clone() for name, t in self.params.items()}

    # -- batched-decode probe ------------------------------------------------------

    def _choose_batched_decode(self, requested: bool | None) -> bool:
        if requested is False:
            return False
        if self.dtype not in _BATCHED_DTYPES:
            problem = f"dtype {self.dtype} is not one of {_BATCHED_DTYPES}"
        elif self.device.type != "cpu":
            problem = f"device {self.device} (verified on CPU only)"
        else:
            problem = self._probe_batched_kernels()
        if problem is None:
            return True
        if requested:
            raise ValueError(f"batched decode requested but unavailable: {problem}")
        log.warning("rollout engine: batched decode off, decoding request by request (%s)", problem)
        return False

    @torch.no_grad()
    def _probe_batched_kernels(self) -> str | None:
        """Verify on this machine, with random operands, what batched decode relies on:
        each projection's rows equal fresh single-row ``F.linear`` (choosing each
        projection's mode), expert slots equal ``Fn.swiglu``, the grouped attention
        bmm items equal the per-request ones and the RoPE table equals the
        per-position computation. Returns the first problem, or None. Kernel choice
        depends on shapes and strides, not on values, so random operands represent
        the real weights."""
        gen = torch.Generator().manual_seed(0)
        rows = sorted({*range(1, min(self.max_batch_size, 16) + 1), self.max_batch_size})
        slots = sorted({*range(1, min(self.max_batch_size * self.cfg.top_k, 16) + 1),
                        self.max_batch_size * self.cfg.top_k})
        layer0 = self._layers[0]
        projections = [layer0.qkv_proj, layer0.o_proj, layer0.router_proj, self._lm_head_proj]
        for proj in projections:
            problem = proj.probe(rows, gen)
            if problem:
                return problem
        problem = layer0.experts.probe(slots, gen)
        if problem:
            return problem
        for layer in self._layers[1:]:  # same shapes: same modes
            for mine, first in zip((layer.qkv_proj, layer.o_proj, layer.router_proj), projections):
                mine.mode = first.mode
            layer.experts.mode = layer0.experts.mode
        problem = self._probe_attention(gen)
        if problem:
            return problem
        d, theta = self.cfg.head_dim, self.cfg.rope_theta
        for pos in range(self.cfg.max_position):
            cos, sin = Fn.rope_cos_sin(torch.tensor([pos], device=self.device), d, theta, self.dtype)
            if not (torch.equal(cos[0], self._rope_cos[pos]) and torch.equal(sin[0], self._rope_sin[pos])):
                return f"the RoPE table differs from the per-position computation at position {pos}"
        return None

    def _probe_attention(self, gen: torch.Generator) -> str | None:
        """Grouped decode attention (``n * heads`` bmm items) vs ``Fn.causal_attention`` per row."""
        hq, hkv, d = self.plan.local_heads, self.plan.local_kv_heads, self.cfg.head_dim
        n = min(self.max_batch_size, 4)
        lengths = {1, 2, 24, 25, 26, 33, 64, self.cfg.max_position}  # both sides of the small-bmm threshold
        for length in sorted(n for n in lengths if n <= self.cfg.max_position):
            q = torch.randn(n, 1, hq, d, generator=gen, dtype=torch.float64).to(self.dtype)
            k = torch.randn(n, length, hkv, d, generator=gen, dtype=torch.float64).to(self.dtype)
            v = torch.randn(n, length, hkv, d, generator=gen, dtype=torch.float64).to(self.dtype)
            pos, kpos = torch.tensor([length - 1]), torch.arange(length)
            want = torch.cat([Fn.causal_attention(q[i : i + 1], k[i : i + 1].clone(), v[i : i + 1].clone(), pos, kpos)
                              for i in range(n)]).reshape(n, hq * d)
            kh = k.transpose(1, 2)[:, self._kv_head_of_q].contiguous()
            vh = v.transpose(1, 2)[:, self._kv_head_of_q].contiguous()
            got = self._grouped_attention(q.reshape(n, hq, d), kh, vh)
            if not torch.equal(got, want):
                return f"grouped decode attention differs from the per-request one at length {length}"
        return None

    # -- collectives -------------------------------------------------------------

    def _tp_sum(self, partials: list[torch.Tensor]) -> list[torch.Tensor]:
        """Sum each row block over TP ranks, in rank order, identically on every rank."""
        if self.plan.tp_size == 1:
            return partials
        sizes = [p.shape[0] for p in partials]
        stacked = torch.cat(partials, dim=0).contiguous()
        flat = torch.empty(
            (self.plan.tp_size * stacked.shape[0], *stacked.shape[1:]), dtype=stacked.dtype, device=stacked.device
        )
        _all_gather_flat(flat, stacked, self.tp_group)
        gathered = flat.view(self.plan.tp_size, *stacked.shape)
        total = gathered[0].clone()
        for r in range(1, self.plan.tp_size):
            total += gathered[r]
        return list(torch.split(total, sizes, dim=0))

    # -- model: one request's rows (prefill, prompt_logprobs, per-request decode) ----

    def _attention_partial(
        self, layer: int, x: torch.Tensor, slot: int, start: int, rope: tuple[torch.Tensor, ...] | None = None
    ) -> torch.Tensor:
        """This rank's o_proj partial for one request's new rows ``x [T, H]``.

        ``rope``: ``(positions, cos, sin)`` of the rows, the same for every layer
        (``_row_rope``); computed here when absent.
        """
        cfg, p = self.cfg, f"model.layers.{layer}.self_attn"
        t, d = x.shape[0], cfg.head_dim
        h = Fn.rms_norm(x, self.params[f"model.layers.{layer}.input_layernorm.weight"], cfg.rms_eps)
        q = F.linear(h, self.params[f"{p}.q_proj.weight"]).view(1, t, -1, d)
        k = F.linear(h, self.params[f"{p}.k_proj.weight"]).view(1, t, -1, d)
        v = F.linear(h, self.params[f"{p}.v_proj.weight"]).view(1, t, -1, d)
        if cfg.qk_norm:
            q = Fn.rms_norm(q, self.params[f"{p}.q_norm.weight"], cfg.rms_eps)
            k = Fn.rms_norm(k, self.params[f"{p}.k_norm.weight"], cfg.rms_eps)
        positions, cos, sin = rope if rope is not None else self._row_rope(start, t)
        q, k = Fn.apply_rope(q, cos, sin), Fn.apply_rope(k, cos, sin)
        self.kv.write(layer, slot, start, k[0], v[0])
        k_all, v_all = self.kv.read(layer, slot, start + t)
        out = Fn.causal_attention(q, k_all, v_all, positions, torch.arange(start + t, device=self.device))
        return F.linear(out.reshape(t, -1), self.params[f"{p}.o_proj.weight"])

    def _row_rope(self, start: int, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, start + t, device=self.device)
        cos, sin = Fn.rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, self.dtype)
        return positions, cos, sin

    def _moe_partial(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """This rank's expert-column partial for one request's rows ``x [T, H]``."""
        cfg, p = self.cfg, f"model.layers.{layer}.mlp"
        h = Fn.rms_norm(x, self.params[f"model.layers.{layer}.post_attention_layernorm.weight"], cfg.rms_eps)
        router_logits = F.linear(h, self.params[f"{p}.gate.weight"])
        _, weights, indices = Fn.route(router_logits, cfg.top_k, cfg.norm_topk_prob)
        order, counts = Fn.moe_dispatch_order(indices, cfg.experts)
        token_of_slot = order // cfg.top_k
        slot_weight = weights.reshape(-1)[order]
        out = torch.zeros_like(h)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                idx = token_of_slot[start : start + n]
                e_p = f"{p}.experts.{e}"
                y = Fn.swiglu(
                    h.index_select(0, idx),
                    self.params[f"{e_p}.gate_proj.weight"],
                    self.params[f"{e_p}.up_proj.weight"],
                    self.params[f"{e_p}.down_proj.weight"],
                )
                out.index_add_(0, idx, y * slot_weight[start : start + n, None])
            start += n
        return out

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(
            Fn.rms_norm(x, self.params["model.norm.weight"], self.cfg.rms_eps), self.params["lm_head.weight"]
        )

    # -- model: many one-token rows together (batched decode) -------------------------

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``Fn.rms_norm`` (same ops, same order), without its no-op casts for fp32."""
        if x.dtype != torch.float32:
            return Fn.rms_norm(x, weight, self.cfg.rms_eps)
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps))

    def _grouped_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``Fn.causal_attention`` for ``n`` one-token queries ``q [n, Hq, D]`` that all see
        every cached key ``k, v [n, Hq, L, D]`` (GQA-expanded): ``[n, Hq * D]``.

        The per-request shapes as bmm items (``[1, D] @ [D, L]`` per head, softmax,
        ``[1, L] @ [L, D]``); the all-visible mask of a decode step is a no-op.
        """
        n, hq, length, d = k.shape
        scores = torch.bmm(q.reshape(n * hq, 1, d), k.view(n * hq, length, d).transpose(1, 2)) * (d**-0.5)
        if scores.dtype != torch.float32:
            probs = torch.softmax(scores.to(torch.float32), dim=-1).to(scores.dtype)
        else:
            probs = torch.softmax(scores, dim=-1)
        return torch.bmm(probs, v.view(n * hq, length, d)).view(n, hq * d)

    def _decode_attention(self, li: int, x: torch.Tensor, dec: _DecodeBatch) -> torch.Tensor:
        """o_proj partial ``[B, H]`` for one-token rows ``x`` (rows ordered by cache length)."""
        plan, layer = self.plan, self._layers[li]
        b, d = x.shape[0], self.cfg.head_dim
        hq, hkv = plan.local_heads, plan.local_kv_heads
        q, k, v = layer.qkv_proj(self._rms(x, layer.input_norm))
        if layer.qkv_proj.mode == "fused":
            # q and k are adjacent column blocks of one output: one [B, hq + hkv, D] view over both
            qk = torch.as_strided(q, (b, hq + hkv, d), (q.stride(0), d, 1), q.storage_offset())
        else:
            qk = torch.cat((q, k), dim=1).view(b, hq + hkv, d)
        if layer.qk_norm is not None:
            qk = self._rms(qk, layer.qk_norm)
        # Fn.apply_rope: x * cos + rotate_half(x) * sin, per element.
        qk = qk * dec.cos + qk.roll(d // 2, dims=-1) * dec.sin_signed
        self.kv.write_rows(li, dec.kv_rows, qk[:, hq:], v.reshape(b, hkv, d))
        outs = []
        for (g0, g1, length), heads in zip(dec.groups, dec.group_heads):
            k_all, v_all = self.kv.gather(li, heads, length)
            n = g1 - g0
            outs.append(
                self._grouped_attention(qk[g0:g1, :hq], k_all.view(n, hq, length, d), v_all.view(n, hq, length, d))
            )
        (out,) = layer.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs))
        return out

    def _decode_moe(self, li: int, x: torch.Tensor) -> torch.Tensor:
        """Expert-column partial ``[B, H]`` for one-token rows ``x``."""
        cfg, layer = self.cfg, self._layers[li]
        b, k = x.shape[0], cfg.top_k
        h = self._rms(x, layer.post_norm)
        (router_logits,) = layer.router_proj(h)
        _, weights, indices = Fn.route(router_logits, k, cfg.norm_topk_prob)
        # A token's slots in expert-id order: the per-request dispatch visits experts that way.
        experts, perm = indices.sort(dim=-1)
        y = layer.experts(h.repeat_interleave(k, dim=0), experts.view(-1))
        y = y.view(b, k, -1) * weights.gather(-1, perm).unsqueeze(-1)
        out = y[:, 0] + 0.0  # the per-request path index_adds into zeros: 0 + y (-0.0 becomes +0.0)
        for j in range(1, k):
            out = out + y[:, j]
        return out

    # -- one step ------------------------------------------------------------------------

    @torch.no_grad()
    def _forward(
        self, rows: Sequence[tuple[int, int, list[int]]], decode: _DecodeBatch | None = None
    ) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """One step: a batched-decode block ``decode`` (or None) and per-request ``rows``
        ``(slot, start_position, new_token_ids)``. Returns (decode logits ``[B, V]`` or
        None, per-row logits ``[T_i, V]``).

        Appends every row's keys/values to its slot. All TP ranks must call
        with the same rows (the collectives carry every row of the step).
        """
        embed = self.params["model.embed_tokens.weight"]
        xs = [F.embedding(torch.tensor(ids, device=self.device), embed) for _, _, ids in rows]
        xd = None if decode is None else F.embedding(decode.tokens, embed)
        ropes = [self._row_rope(start, len(ids)) for _, start, ids in rows]
        for layer in range(self.cfg.layers):
            partials = [self._attention_partial(layer, x, slot, start, rope)
                        for x, (slot, start, _), rope in zip(xs, rows, ropes)]
            if xd is None:
                xs = [x + a for x, a in zip(xs, self._tp_sum(partials))]
            else:
                summed = self._tp_sum([self._decode_attention(layer, xd, decode), *partials])
                xd = xd + summed[0]
                xs = [x + a for x, a in zip(xs, summed[1:])]
            partials = [self._moe_partial(layer, x) for x in xs]
            if xd is None:
                xs = [x + m for x, m in zip(xs, self._tp_sum(partials))]
            else:
                summed = self._tp_sum([self._decode_moe(layer, xd), *partials])
                xd = xd + summed[0]
                xs = [x + m for x, m in zip(xs, summed[1:])]
        decode_logits = None
        if xd is not None:
            norm = self._rms(xd, self.params["model.norm.weight"])
            (decode_logits,) = self._lm_head_proj(norm)
        return decode_logits, [self._logits(x) for x in xs]

    # -- public API ---------------------------------------------------------------

    @torch.no_grad()
    def prompt_logprobs(self, token_ids: Sequence[int]) -> torch.Tensor:
        """``[S]`` fp32 logprobs of ``token_ids`` under the engine (column 0 is 0).

        Uses (and frees) one KV slot; the design.md per-token convention.
        """
        slot = self.kv.allocate()
        try:
            _, (logits,) = self._forward([(slot, 0, list(token_ids))])
        finally:
            self.kv.release(slot)
        ids = torch.tensor(list(token_ids), device=self.device).unsqueeze(0)
        return Fn.token_logprobs(logits.unsqueeze(0), ids)[0]

    def _start(self, request: Mapping[str, Any]) -> _Sequence:
        prompt = list(request["prompt_ids"])
        room = self.cfg.max_position - len(prompt)
        return _Sequence(
            request=request,
            slot=self.kv.allocate(),
            generator=torch.Generator().manual_seed(int(request["seed"])),
            max_new=min(int(request["max_new_tokens"]), room),
            tokens=prompt,
            temperature=float(request["temperature"]),
            top_p=float(request["top_p"]),
        )

    def _record(self, seq: _Sequence, token: int, logprob: float) -> None:
        seq.cached = len(seq.tokens)
        seq.tokens.append(token)
        seq.output_ids.append(token)
        seq.logprobs.append(logprob)
        if self.eos_token_id is not None and token == self.eos_token_id:
            seq.finish_reason = "eos"
        elif len(seq.output_ids) >= seq.max_new:
            seq.finish_reason = "length"

    def _advance(self, seq: _Sequence, logits: torch.Tensor) -> None:
        token, logprob = sample_token(logits[-1], temperature=seq.temperature, top_p=seq.top_p, generator=seq.generator)
        self._record(seq, token, logprob)

    def _step(self, step: list[_Sequence]) -> None:
        """Run one step for ``step`` (decoding rows and newly admitted prefills) and sample.

        Rows that decode one token go through the batched path (when on and at
        least two); the rest run per request. Prefills of identical prompts in the
        step (GRPO's generations of one prompt) are computed once: the same
        computation on the same tokens gives the same bits, so the followers get
        a copy of the leader's KV prefix and sample from the leader's logits with
        their own generators.
        """
        decoding = [s for s in step if s.cached > 0] if self.batched_decode else []
        if len(decoding) < 2:
            decoding = []  # a lone row gains nothing from the batched path
        chosen = {id(s) for s in decoding}
        computed: list[_Sequence] = []
        leaders: dict[tuple[int, ...], _Sequence] = {}
        followers: dict[int, list[_Sequence]] = {}
        for seq in step:
            if id(seq) in chosen:
                continue
            if seq.cached == 0:
                leader = leaders.setdefault(tuple(seq.tokens), seq)
                if leader is not seq:
                    followers.setdefault(id(leader), []).append(seq)
                    continue
            computed.append(seq)
        decode = _DecodeBatch.build(self, decoding) if decoding else None
        rows = [(s.slot, s.cached, s.tokens[s.cached :]) for s in computed]
        decode_logits, row_logits = self._forward(rows, decode)
        if decode is not None:
            seqs = decode.seqs
            tokens, logprobs = sample_rows(
                decode_logits,
                temperatures=[s.temperature for s in seqs],
                top_ps=[s.top_p for s in seqs],
                generators=[s.generator for s in seqs],
            )
            for seq, token, logprob in zip(seqs, tokens, logprobs):
                self._record(seq, token, logprob)
        for seq, logits in zip(computed, row_logits):
            copies = followers.get(id(seq), [])
            if copies:
                self.kv.copy_prefix(seq.slot, [c.slot for c in copies], len(seq.tokens))
            for s in (seq, *copies):
                self._advance(s, logits)

    @torch.no_grad()
    def generate(self, requests: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Generate for every request; results in request order (see module docstring)."""
        for request in requests:
            validate_request(request, vocab=self.cfg.vocab, max_position=self.cfg.max_position)
        ids = [r["request_id"] for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("rollout request_ids within one generate call must be unique")
        results: dict[int, dict[str, Any]] = {}
        waiting = list(enumerate(requests))
        running: list[tuple[int, _Sequence]] = []
        while waiting or running:
            admitted: list[tuple[int, _Sequence]] = []
            while waiting and len(running) + len(admitted) < self.max_batch_size:
                index, request = waiting.pop(0)
                if int(request["max_new_tokens"]) == 0:
                    results[index] = make_result(request, [], [], "length", self.weight_version)
                    continue
                admitted.append((index, self._start(request)))
            step = running + admitted
            if not step:
                continue
            self._step([seq for _, seq in step])
            running = []
            for index, seq in step:
                if seq.finish_reason is None:
                    running.append((index, seq))
                else:
                    self.kv.release(seq.slot)
                    results[index] = make_result(
                        seq.request, seq.output_ids, seq.logprobs, seq.finish_reason, self.weight_version
                    )
        return [results[i] for i in range(len(requests))]


@dataclass
class _DecodeBatch:
    """The one-token rows of a step, ordered by cache length (attention groups)."""

    seqs: list[_Sequence]
    tokens: torch.Tensor  # [B] new token ids
    kv_rows: torch.Tensor  # KVCachePool.row_index of (slot, position of the new token)
    cos: torch.Tensor  # [B, 1, D]
    sin_signed: torch.Tensor  # [B, 1, D]
    groups: list[tuple[int, int, int]]  # (first row, end row, cache length incl. the new token)
    group_heads: list[torch.Tensor]  # per group: KVCachePool.head_index of (slot, kv head of each q head)

    @classmethod
    def build(cls, engine: Engine, seqs: list[_Sequence]) -> _DecodeBatch:
        seqs = sorted(seqs, key=lambda s: s.cached)
        for s in seqs:
            if len(s.tokens) - s.cached != 1:
                raise AssertionError("batched decode rows carry exactly one new token")
            if s.cached >= engine.cfg.max_position:
                raise RuntimeError(
                    f"sequence length {s.cached + 1} exceeds model.max_position ({engine.cfg.max_position})"
                )
        dev = engine.device
        positions = torch.tensor([s.cached for s in seqs], device=dev)
        slots = torch.tensor([s.slot for s in seqs], device=dev)
        groups: list[tuple[int, int, int]] = []
        for i, s in enumerate(seqs):
            if groups and groups[-1][2] == s.cached + 1:
                groups[-1] = (groups[-1][0], i + 1, s.cached + 1)
            else:
                groups.append((i, i + 1, s.cached + 1))
        heads = engine.kv.head_index(slots, engine._kv_head_of_q)
        hq = engine.plan.local_heads
        return cls(
            seqs=seqs,
            tokens=torch.tensor([s.tokens[-1] for s in seqs], device=dev),
            kv_rows=engine.kv.row_index(slots, positions),
            cos=engine._rope_cos[positions].unsqueeze(1),
            sin_signed=engine._rope_sin_signed[positions].unsqueeze(1),
            groups=groups,
            group_heads=[heads[g0 * hq : g1 * hq] for g0, g1, _ in groups],
        )
