"""The grouped batched-decode kernels: many one-token rows through a layer together.

Every matrix product is a row-item bmm (``projections``); attention groups the
rows by cache length and runs the per-request shapes (``[1, D] @ [D, L]`` per
head, softmax, ``[1, L] @ [L, D]``) as bmm items; element-wise ops are per
element and reductions row-local; a token's MoE slot outputs are summed in
expert-id order, as the per-request dispatch visits them. ``Forward`` inherits
these methods (``GroupedDecode`` is a mixin over its state: ``cfg``, ``plan``,
``layers``, ``kv``); the result equals the per-request decode bit for bit where
``probe.py`` confirmed the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from harness import ops
from harness.model.config import ModelConfig
from harness.rollout.native.kv_cache import KVCachePool
from harness.rollout.native.weights import PackedLayer
from harness.rollout.sharding import ShardPlan

if TYPE_CHECKING:
    from harness.rollout.native.decode_batch import DecodeBatch


class GroupedDecode:
    """``Forward``'s grouped batched-decode kernels (the default batched path)."""

    cfg: ModelConfig
    plan: ShardPlan
    layers: list[PackedLayer]
    kv: KVCachePool

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
