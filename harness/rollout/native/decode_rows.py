"""The row-local batched-decode kernels (``Forward.row_local``, chosen by the probe).

Only the matrix products are batched (the probe-verified projections); every
reduction and the attention run per row on the per-request shapes and layouts
(``ops.rms_norm`` of ``[1, H]``, the q and k norms apart, the row's own RoPE,
``kv.write``/``kv.read`` and ``ops.causal_attention`` of the slot, ``ops.route``
of ``[1, E]``): the per-request computation itself, with the GEMMs shared. The
expert sum is the grouped family's (``GroupedDecode._experts_sum``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from harness import ops
from harness.rollout.native.decode_grouped import GroupedDecode

if TYPE_CHECKING:
    from harness.rollout.native.decode_batch import DecodeBatch


class RowLocalDecode(GroupedDecode):
    """``Forward``'s row-local batched-decode kernels (a mixin over its state)."""

    params: dict[str, torch.Tensor]
    device: torch.device

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
