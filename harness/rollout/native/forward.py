"""One step's forward math of the native engine on one TP rank, and the TP sum.

Two paths, one rule: *every floating-point result of a request is computed by
the same kernel, on operands of the same shape and layout, whatever else is in
the step* (so a request's tokens and logprobs never depend on the batch, on
``max_batch_size`` or on its KV slot).

* **Per request** (prefill, ``prompt_logprobs``, and decode where batched decode
  is off): each request's rows run alone with their own shapes (``[1, T]``), the
  reference model's computation (``harness.ops``), over the HF-named views.
* **Batched decode**: the one-token rows of the running requests go through
  each layer together, described once per step by ``decode_batch.DecodeBatch``.
  Three kernel families, one module each, which ``Forward`` inherits as mixins:
  ``decode_grouped`` (row-item bmm products, attention grouped by cache length;
  equal to the per-request decode bit for bit where ``probe.py`` confirmed the
  kernels), ``decode_rows`` (``row_local``, chosen by the probe on a GPU: only
  the GEMMs batched, every reduction and the attention per row on the
  per-request shapes) and ``decode_invariant`` (``kernels == "invariant"``, the
  engine's ``decode_kernels``: the fixed-order kernels of ``invariant``, a row's
  bits the same in any batch, but not those of the per-request decode).

The TP sum is an ``all_gather`` followed by a sum in rank order, not an
``all_reduce`` (whose ring chunking makes an element's summation order depend on
the tensor size): the reduced rows are bitwise identical on every TP rank and
for every batch composition, so every rank samples the same tokens. One
collective per layer and sub-layer carries every row of the step, decode and
per-request rows together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness import ops
from harness.model.config import ModelConfig
from harness.model.grouped import grouped_swiglu, use_grouped
from harness.rollout.native import invariant as inv
from harness.rollout.native.decode_batch import DecodeBatch, DecodeRow
from harness.rollout.native.decode_invariant import InvariantDecode
from harness.rollout.native.decode_rows import RowLocalDecode
from harness.rollout.native.kv_cache import KVCachePool
from harness.rollout.native.weights import PackedWeights
from harness.rollout.sharding import ShardPlan

__all__ = ["DecodeBatch", "DecodeRow", "Forward"]  # DecodeBatch/DecodeRow: re-exported (decode_batch)


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    """``all_gather`` into a flat ``[tp * N, ...]`` output (``all_gather_single`` when available)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp, group=group)


class Forward(RowLocalDecode, InvariantDecode):
    """The step computation over ``weights`` and the KV cache ``kv`` of one TP rank.

    Builds the RoPE tables (``max_position`` rows, equal to the per-position
    computation: ``probe.py`` checks it) and the kv head of each local q head.
    With ``plan.tp_size > 1`` every TP rank calls ``step`` with the same rows.
    The per-request path, the TP sum and the step live here; the batched-decode
    kernels come from the mixins (``decode_grouped``, ``decode_rows``,
    ``decode_invariant``), chosen per step by ``row_local`` and ``kernels``.
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
        # cuda: grouped GEMMs over the packed expert weights (fp32 only with the invariant kernels,
        # whose probe set grouped_prefill: the standard kernels' probe compares against the loop)
        if self.grouped_prefill or (use_grouped(h) and h.dtype != torch.float32):
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

