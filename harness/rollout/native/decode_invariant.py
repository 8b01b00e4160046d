"""The batch-invariant decode kernels (``Forward.kernels == "invariant"``).

Every decoding row, a lone one too, goes through these on the fixed-order
kernels of ``invariant`` (folded norms, router softmax and attention over the
batch's longest cache, each row masked to its own length; every matrix product
an element-wise product folded over its inner dimension, so no GEMM kernel is
picked by the row count). A row's bits are the same in any batch by
construction (``probe.probe_invariant`` checks it on the device), but not those
of the per-request decode, whose kernels differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from harness.model.config import ModelConfig
from harness.rollout.native import invariant as inv
from harness.rollout.native.kv_cache import KVCachePool
from harness.rollout.native.weights import PackedLayer
from harness.rollout.sharding import ShardPlan

if TYPE_CHECKING:
    from harness.rollout.native.decode_batch import DecodeBatch


class InvariantDecode:
    """``Forward``'s batch-invariant decode kernels (a mixin over its state)."""

    cfg: ModelConfig
    plan: ShardPlan
    layers: list[PackedLayer]
    kv: KVCachePool

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
