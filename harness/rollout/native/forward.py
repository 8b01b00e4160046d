"""One step's forward math of the native engine on one TP rank, and the TP sum.

Two paths, one rule: *every floating-point result of a request is computed by
the same kernel, on operands of the same shape and layout, whatever else is in
the step* (so a request's tokens and logprobs never depend on the batch, on
``max_batch_size`` or on its KV slot).

* **Per request** (prefill, ``prompt_logprobs``, and decode where batched decode
  is off): each request's rows run alone with their own shapes (``[1, T]``), the
  reference model's computation (``harness.ops``), over the HF-named views.
* **Batched decode**: the one-token rows of the running requests go through
  each layer together. Every matrix product is a row-item bmm (``projections``);
  attention groups the rows by cache length and runs the per-request shapes
  (``[1, D] @ [D, L]`` per head, softmax, ``[1, L] @ [L, D]``) as bmm items;
  element-wise ops are per element and reductions (RMSNorm's mean, softmax,
  top-k) row-local; a token's MoE slot outputs are summed in expert-id order, as
  the per-request dispatch visits them. The result equals the per-request
  decode bit for bit where ``probe.py`` confirmed the kernels.
* **Row-local batched decode** (``row_local``, chosen by the probe on a GPU, where
  the batched attention or reductions do not reproduce the per-request bits):
  only the matrix products are batched (the probe-verified projections); every
  reduction and the attention run per row on the per-request shapes and layouts
  (``ops.rms_norm`` of ``[1, H]``, the q and k norms apart, the row's own RoPE,
  ``kv.write``/``kv.read`` and ``ops.causal_attention`` of the slot, ``ops.route``
  of ``[1, E]``): the per-request computation itself, with the GEMMs shared.
* **Invariant batched decode** (``kernels == "invariant"``, the engine's
  ``decode_kernels``): every decoding row, a lone one too, goes through the
  batched path on the fixed-order kernels of ``invariant`` (folded norms, router
  softmax and attention over the batch's longest cache, each row masked to its
  own length; every matrix product an element-wise product folded over its inner
  dimension, so no GEMM kernel is picked by the row count). A row's bits are
  the same in any batch by construction (``probe.probe_invariant`` checks it on
  the device), but not those of the per-request decode, whose kernels differ.

The TP sum is an ``all_gather`` followed by a sum in rank order, not an
``all_reduce`` (whose ring chunking makes an element's summation order depend on
the tensor size): the reduced rows are bitwise identical on every TP rank and
for every batch composition, so every rank samples the same tokens. One
collective per layer and sub-layer carries every row of the step, decode and
per-request rows together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness import ops
from harness.model.config import ModelConfig
from harness.model.grouped import grouped_swiglu, use_grouped
from harness.rollout.native import invariant as inv
from harness.rollout.native.kv_cache import KVCachePool
from harness.rollout.native.weights import PackedWeights
from harness.rollout.sharding import ShardPlan


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    """``all_gather`` into a flat ``[tp * N, ...]`` output (``all_gather_single`` when available)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp, group=group)


class DecodeRow(Protocol):
    """What a batched-decode row needs of a running request."""

    slot: int
    cached: int  # positions already in the KV cache
    tokens: list[int]  # prompt + output so far; the last one is the new token


class Forward:
    """The step computation over ``weights`` and the KV cache ``kv`` of one TP rank.

    Builds the RoPE tables (``max_position`` rows, equal to the per-position
    computation: ``probe.py`` checks it) and the kv head of each local q head.
    With ``plan.tp_size > 1`` every TP rank calls ``step`` with the same rows.
    """

    def __init__(self, cfg: ModelConfig, plan: ShardPlan, weights: PackedWeights, kv: KVCachePool,
                 tp_group: Any, device: torch.device, dtype: torch.dtype) -> None:
        self.cfg, self.plan, self.weights, self.kv = cfg, plan, weights, kv
        self.params, self.layers = weights.params, weights.layers
        self.tp_group, self.device, self.dtype = tp_group, device, dtype
        positions = torch.arange(cfg.max_position, device=device)
        cos, sin = ops.rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, dtype)
        half = cfg.head_dim // 2
        # rotate_half(x) * sin == roll(x, half) * [-sin_1, sin_2] exactly (negation is exact).
        self.rope_cos = cos.contiguous()
        self.rope_sin = sin.contiguous()
        self.rope_sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).contiguous()
        self.kv_head_of_q = torch.arange(plan.local_heads, device=device) // (plan.local_heads // plan.local_kv_heads)
        self.row_local = False  # the probe may set it (a GPU): reductions and attention per row
        # "invariant": batched decode on the fixed-order kernels of ``invariant`` (the engine's
        # ``decode_kernels``); "standard": the per-request computation's kernels (above)
        self.kernels = "standard"
        self.grouped_prefill = False  # invariant kernels on cuda: the per-request MoE as grouped GEMMs

    # -- collectives -------------------------------------------------------------

    def tp_sum(self, partials: list[torch.Tensor]) -> list[torch.Tensor]:
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

    # -- one request's rows (prefill, prompt_logprobs, per-request decode) ----------

    def attention_partial(
        self, layer: int, x: torch.Tensor, slot: int, start: int, rope: tuple[torch.Tensor, ...] | None = None
    ) -> torch.Tensor:
        """This rank's o_proj partial for one request's new rows ``x [T, H]``.

        ``rope``: ``(positions, cos, sin)`` of the rows, the same for every layer
        (``row_rope``); computed here when absent.
        """
        cfg, p = self.cfg, f"model.layers.{layer}.self_attn"
        t, d = x.shape[0], cfg.head_dim
        h = ops.rms_norm(x, self.params[f"model.layers.{layer}.input_layernorm.weight"], cfg.rms_eps)
        q = F.linear(h, self.params[f"{p}.q_proj.weight"]).view(1, t, -1, d)
        k = F.linear(h, self.params[f"{p}.k_proj.weight"]).view(1, t, -1, d)
        v = F.linear(h, self.params[f"{p}.v_proj.weight"]).view(1, t, -1, d)
        if cfg.qk_norm:
            q = ops.rms_norm(q, self.params[f"{p}.q_norm.weight"], cfg.rms_eps)
            k = ops.rms_norm(k, self.params[f"{p}.k_norm.weight"], cfg.rms_eps)
        positions, cos, sin = rope if rope is not None else self.row_rope(start, t)
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        self.kv.write(layer, slot, start, k[0], v[0])
        k_all, v_all = self.kv.read(layer, slot, start + t)
        out = ops.causal_attention(q, k_all, v_all, positions, torch.arange(start + t, device=self.device))
        return F.linear(out.reshape(t, -1), self.params[f"{p}.o_proj.weight"])

    def row_rope(self, start: int, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, start + t, device=self.device)
        cos, sin = ops.rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, self.dtype)
        return positions, cos, sin

    def moe_partial(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """This rank's expert-column partial for one request's rows ``x [T, H]``."""
        cfg, p = self.cfg, f"model.layers.{layer}.mlp"
        h = ops.rms_norm(x, self.params[f"model.layers.{layer}.post_attention_layernorm.weight"], cfg.rms_eps)
        router_logits = F.linear(h, self.params[f"{p}.gate.weight"])
        _, weights, indices = ops.route(router_logits, cfg.top_k, cfg.norm_topk_prob)
        order, counts = ops.moe_dispatch_order(indices, cfg.experts)
        token_of_slot = order // cfg.top_k
        slot_weight = weights.reshape(-1)[order]
        if use_grouped(h) or self.grouped_prefill:  # cuda: grouped GEMMs over the packed expert weights
            experts = self.layers[layer].experts
            gate_up, down = experts.views(experts.pack)
            y = grouped_swiglu(h.index_select(0, token_of_slot), gate_up.transpose(1, 2), down.transpose(1, 2), counts)
            return torch.zeros_like(h).index_add_(0, token_of_slot, y * slot_weight[:, None])
        out = torch.zeros_like(h)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                idx = token_of_slot[start : start + n]
                e_p = f"{p}.experts.{e}"
                y = ops.swiglu(
                    h.index_select(0, idx),
                    self.params[f"{e_p}.gate_proj.weight"],
                    self.params[f"{e_p}.up_proj.weight"],
                    self.params[f"{e_p}.down_proj.weight"],
                )
                out.index_add_(0, idx, y * slot_weight[start : start + n, None])
            start += n
        return out

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(
            ops.rms_norm(x, self.params["model.norm.weight"], self.cfg.rms_eps), self.params["lm_head.weight"]
        )

    # -- many one-token rows together (batched decode) -------------------------------

    def rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``ops.rms_norm`` (same ops, same order), without its no-op casts for fp32."""
        if x.dtype != torch.float32:
            return ops.rms_norm(x, weight, self.cfg.rms_eps)
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps))

    @staticmethod
    def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``ops.causal_attention`` for ``n`` one-token queries ``q [n, Hq, D]`` that all see
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

    def decode_attention(self, li: int, x: torch.Tensor, dec: DecodeBatch) -> torch.Tensor:
        """o_proj partial ``[B, H]`` for one-token rows ``x`` (rows ordered by cache length)."""
        plan, layer = self.plan, self.layers[li]
        b, d = x.shape[0], self.cfg.head_dim
        hq, hkv = plan.local_heads, plan.local_kv_heads
        q, k, v = layer.qkv_proj(self.rms(x, layer.input_norm))
        if layer.qkv_proj.mode == "fused":
            # q and k are adjacent column blocks of one output: one [B, hq + hkv, D] view over both
            qk = torch.as_strided(q, (b, hq + hkv, d), (q.stride(0), d, 1), q.storage_offset())
        else:
            qk = torch.cat((q, k), dim=1).view(b, hq + hkv, d)
        if layer.qk_norm is not None:
            qk = self.rms(qk, layer.qk_norm)
        # ops.apply_rope: x * cos + rotate_half(x) * sin, per element.
        qk = qk * dec.cos + qk.roll(d // 2, dims=-1) * dec.sin_signed
        self.kv.write_rows(li, dec.kv_rows, qk[:, hq:], v.reshape(b, hkv, d))
        outs = []
        for (g0, g1, length), heads in zip(dec.groups, dec.group_heads):
            k_all, v_all = self.kv.gather(li, heads, length)
            n = g1 - g0
            outs.append(
                self.grouped_attention(qk[g0:g1, :hq], k_all.view(n, hq, length, d), v_all.view(n, hq, length, d))
            )
        (out,) = layer.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs))
        return out

    def decode_moe(self, li: int, x: torch.Tensor) -> torch.Tensor:
        """Expert-column partial ``[B, H]`` for one-token rows ``x``."""
        cfg, layer = self.cfg, self.layers[li]
        h = self.rms(x, layer.post_norm)
        (router_logits,) = layer.router_proj(h)
        _, weights, indices = ops.route(router_logits, cfg.top_k, cfg.norm_topk_prob)
        return self._experts_sum(li, h, weights, indices)

    def _experts_sum(self, li: int, h: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """Rows ``h [B, H]``'s expert slots (``weights``, ``indices [B, k]``), summed per row."""
        b, k = indices.shape
        # A token's slots in expert-id order: the per-request dispatch visits experts that way.
        experts, perm = indices.sort(dim=-1)
        y = self.layers[li].experts(h.repeat_interleave(k, dim=0), experts.view(-1))
        y = y.view(b, k, -1) * weights.gather(-1, perm).unsqueeze(-1)
        out = y[:, 0] + 0.0  # the per-request path index_adds into zeros: 0 + y (-0.0 becomes +0.0)
        for j in range(1, k):
            out = out + y[:, j]
        return out

    # -- row-local batched decode (reductions and attention on per-request shapes) -------------

    def _norm_rows(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``ops.rms_norm`` of each row ``[1, H]`` alone (the per-request shape)."""
        return torch.cat([ops.rms_norm(x[i : i + 1], weight, self.cfg.rms_eps) for i in range(x.shape[0])])

    def decode_attention_rows(self, li: int, x: torch.Tensor, dec: DecodeBatch) -> torch.Tensor:
        """``decode_attention`` with every non-GEMM op per row, as ``attention_partial`` runs it."""
        cfg, plan, layer, p = self.cfg, self.plan, self.layers[li], f"model.layers.{li}.self_attn"
        d, hq = cfg.head_dim, plan.local_heads
        q, k, v = layer.qkv_proj(self._norm_rows(x, layer.input_norm))
        outs = []
        for i, seq in enumerate(dec.seqs):
            qi, ki, vi = (t[i : i + 1].reshape(1, 1, -1, d) for t in (q, k, v))
            if cfg.qk_norm:
                qi = ops.rms_norm(qi, self.params[f"{p}.q_norm.weight"], cfg.rms_eps)
                ki = ops.rms_norm(ki, self.params[f"{p}.k_norm.weight"], cfg.rms_eps)
            positions, cos, sin = dec.row_ropes[i]
            qi, ki = ops.apply_rope(qi, cos, sin), ops.apply_rope(ki, cos, sin)
            self.kv.write(li, seq.slot, seq.cached, ki[0], vi[0])
            k_all, v_all = self.kv.read(li, seq.slot, seq.cached + 1)
            out = ops.causal_attention(qi, k_all, v_all, positions, torch.arange(seq.cached + 1, device=self.device))
            outs.append(out.reshape(1, hq * d))
        (out,) = layer.o_proj(torch.cat(outs))
        return out

    def decode_moe_rows(self, li: int, x: torch.Tensor) -> torch.Tensor:
        """``decode_moe`` with the norm and the routing per row (``ops.route`` of ``[1, E]``)."""
        cfg, layer = self.cfg, self.layers[li]
        b, k = x.shape[0], cfg.top_k
        h = self._norm_rows(x, layer.post_norm)
        (router_logits,) = layer.router_proj(h)
        routed = [ops.route(router_logits[i : i + 1], k, cfg.norm_topk_prob) for i in range(b)]
        weights = torch.cat([w for _, w, _ in routed])
        indices = torch.cat([ix for _, _, ix in routed])
        return self._experts_sum(li, h, weights, indices)

    # -- batch-invariant decode (``invariant``: fixed-order reductions) ------------------------

    def decode_attention_invariant(self, li: int, x: torch.Tensor, dec: DecodeBatch) -> torch.Tensor:
        """``decode_attention`` on the ``invariant`` kernels: norms and attention folded, all
        rows padded to the batch's longest cache and masked (a row's bits do not depend on it)."""
        plan, layer, eps = self.plan, self.layers[li], self.cfg.rms_eps
        b, d = x.shape[0], self.cfg.head_dim
        hq, hkv = plan.local_heads, plan.local_kv_heads
        qkv = inv.linear(inv.rms_norm(x, layer.input_norm, eps), layer.qkv_proj.pack)  # [q | k | v] columns
        qk = qkv[:, : (hq + hkv) * d].view(b, hq + hkv, d)
        if layer.qk_norm is not None:
            qk = inv.rms_norm(qk, layer.qk_norm, eps)
        qk = qk * dec.cos + qk.roll(d // 2, dims=-1) * dec.sin_signed
        self.kv.write_rows(li, dec.kv_rows, qk[:, hq:], qkv[:, (hq + hkv) * d :].reshape(b, hkv, d))
        keys = self.kv.k[li][:, :, : dec.max_length].index_select(0, dec.slots)
        values = self.kv.v[li][:, :, : dec.max_length].index_select(0, dec.slots)
        out = inv.decode_attention(qk[:, :hq].reshape(b, hkv, hq // hkv, d), keys, values, dec.lengths)
        return inv.linear(out, layer.o_proj.pack)

    def decode_moe_invariant(self, li: int, x: torch.Tensor) -> torch.Tensor:
        """``decode_moe`` on the ``invariant`` kernels (folded norm and router softmax)."""
        cfg, layer = self.cfg, self.layers[li]
        b, k = x.shape[0], cfg.top_k
        h = inv.rms_norm(x, layer.post_norm, cfg.rms_eps)
        weights, indices = inv.route(inv.linear(h, layer.router_proj.pack), k, cfg.norm_topk_prob)
        experts, perm = indices.sort(dim=-1)  # a token's slots in expert-id order, as everywhere
        y = inv.expert_swiglu(h.repeat_interleave(k, dim=0), experts.view(-1),
                              *layer.experts.views(layer.experts.pack))
        y = y.view(b, k, -1) * weights.gather(-1, perm).unsqueeze(-1)
        out = y[:, 0] + 0.0
        for j in range(1, k):
            out = out + y[:, j]
        return out

    # -- one step ------------------------------------------------------------------------

    def _decode_attention_kernel(self) -> Callable[[int, torch.Tensor, DecodeBatch], torch.Tensor]:
        if self.kernels == "invariant":
            return self.decode_attention_invariant
        return self.decode_attention_rows if self.row_local else self.decode_attention

    def _decode_moe_kernel(self) -> Callable[[int, torch.Tensor], torch.Tensor]:
        if self.kernels == "invariant":
            return self.decode_moe_invariant
        return self.decode_moe_rows if self.row_local else self.decode_moe

    @torch.no_grad()
    def step(
        self, rows: Sequence[tuple[int, int, list[int]]], decode: DecodeBatch | None = None
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
        ropes = [self.row_rope(start, len(ids)) for _, start, ids in rows]
        for layer in range(self.cfg.layers):
            partials = [self.attention_partial(layer, x, slot, start, rope)
                        for x, (slot, start, _), rope in zip(xs, rows, ropes)]
            if xd is None:
                xs = [x + a for x, a in zip(xs, self.tp_sum(partials))]
            else:
                attend = self._decode_attention_kernel()
                summed = self.tp_sum([attend(layer, xd, decode), *partials])
                xd = xd + summed[0]
                xs = [x + a for x, a in zip(xs, summed[1:])]
            partials = [self.moe_partial(layer, x) for x in xs]
            if xd is None:
                xs = [x + m for x, m in zip(xs, self.tp_sum(partials))]
            else:
                moe = self._decode_moe_kernel()
                summed = self.tp_sum([moe(layer, xd), *partials])
                xd = xd + summed[0]
                xs = [x + m for x, m in zip(xs, summed[1:])]
        decode_logits = None
        if xd is not None:
            final = self.params["model.norm.weight"]
            if self.kernels == "invariant":
                decode_logits = inv.linear(inv.rms_norm(xd, final, self.cfg.rms_eps), self.weights.lm_head_proj.pack)
            else:
                norm = self._norm_rows(xd, final) if self.row_local else self.rms(xd, final)
                (decode_logits,) = self.weights.lm_head_proj(norm)
        return decode_logits, [self.logits(x) for x in xs]


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
