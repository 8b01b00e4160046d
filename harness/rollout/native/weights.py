"""One TP rank's weights of the native engine: packed tensors with HF-named views.

Per layer the weights live in a few packed tensors (``[q; k; v]``, ``o``, the
router, and per expert ``gate_up`` followed by ``down``) that the batched-decode
projections read; every HF-named parameter is a view into them, which prefill,
``state_dict`` and refit read and write. ``load`` copies into the views, so the
packs and the names never disagree: values are the same either way, only the
storage differs. The per-head ``qk_norm`` pack is the one copy (q_norm repeated
per local q head, k_norm per local kv head), refreshed whenever a q/k norm loads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from harness.model.config import ModelConfig
from harness.rollout.native.projections import ExpertProjection, RowProjection
from harness.rollout.sharding import ShardPlan, hf_weight_shapes


@dataclass
class PackedLayer:
    """One layer's packed tensors (the HF-named parameters are views into them) and the
    batched-decode projections over them."""

    input_norm: torch.Tensor
    qkv: torch.Tensor  # [q_width + 2 kv_width, H]
    qk_norm: torch.Tensor | None  # [local_heads + local_kv_heads, D]: q_norm per q head, k_norm per k head
    o: torch.Tensor  # [H, q_width]
    post_norm: torch.Tensor
    router: torch.Tensor  # [E, H]
    experts_pack: torch.Tensor  # [E, 3 I H]: per expert gate rows, up rows ([2I, H]), then down [H, I]
    qkv_proj: RowProjection
    o_proj: RowProjection
    router_proj: RowProjection
    experts: ExpertProjection


class PackedWeights:
    """This rank's shard of every HF-named tensor (zeros until ``load``), packed per layer.

    ``params``: HF name -> this rank's shard (a view into a pack), in the reference
    model's order; ``layers``: the packs per layer; ``lm_head_proj``: the batched
    ``lm_head`` projection; ``full_shapes``: the full (unsharded) shape per name.
    """

    def __init__(self, cfg: ModelConfig, plan: ShardPlan, dtype: torch.dtype, device: torch.device) -> None:
        self.cfg, self.plan, self.dtype, self.device = cfg, plan, dtype, device
        self.full_shapes = hf_weight_shapes(cfg)
        self._allocate()

    def _allocate(self) -> None:
        cfg, plan, dt, dev = self.cfg, self.plan, self.dtype, self.device
        h, d, e = cfg.hidden, cfg.head_dim, cfg.experts
        qw, kvw = plan.local_heads * d, plan.local_kv_heads * d
        inter = cfg.moe_intermediate // plan.tp_size

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=dt, device=dev)

        params: dict[str, torch.Tensor] = {}
        layers: list[PackedLayer] = []
        params["model.embed_tokens.weight"] = zeros(cfg.vocab, h)
        for i in range(cfg.layers):
            p = f"model.layers.{i}"
            qkv, o, router = zeros(qw + 2 * kvw, h), zeros(h, qw), zeros(e, h)
            experts = ExpertProjection(zeros(e, 3 * inter * h), h, inter)
            gate_up, down = experts.views(experts.pack)
            layer = PackedLayer(
                input_norm=zeros(h),
                qkv=qkv,
                qk_norm=zeros(plan.local_heads + plan.local_kv_heads, d) if cfg.qk_norm else None,
                o=o,
                post_norm=zeros(h),
                router=router,
                experts_pack=experts.pack,
                qkv_proj=RowProjection(qkv, [(0, qw), (qw, qw + kvw), (qw + kvw, qw + 2 * kvw)]),
                o_proj=RowProjection(o, [(0, h)]),
                router_proj=RowProjection(router, [(0, e)]),
                experts=experts,
            )
            layers.append(layer)
            params[f"{p}.input_layernorm.weight"] = layer.input_norm
            params[f"{p}.self_attn.q_proj.weight"] = qkv[:qw]
            params[f"{p}.self_attn.k_proj.weight"] = qkv[qw : qw + kvw]
            params[f"{p}.self_attn.v_proj.weight"] = qkv[qw + kvw :]
            params[f"{p}.self_attn.o_proj.weight"] = o
            if cfg.qk_norm:
                # Their own tensors; load refreshes the per-head rows of qk_norm.
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
        for name, shape in self.full_shapes.items():
            want = self.plan.local_shape(name, shape)
            if tuple(params[name].shape) != want or not params[name].is_contiguous():
                raise AssertionError(
                    f"engine parameter layout broken for {name}: {tuple(params[name].shape)} vs {want}"
                )
        self.params = {name: params[name] for name in self.full_shapes}  # model order
        self.layers = layers
        self.lm_head_proj = RowProjection(params["lm_head.weight"], [(0, cfg.vocab)])

    def state_dict_info(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Full (unsharded) ``(shape, dtype)`` per HF name: what a refit must send."""
        return {name: (shape, self.dtype) for name, shape in self.full_shapes.items()}

    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """Copy full tensors into this rank's shards; return the names loaded.

        Unknown names, wrong shapes or dtypes raise ValueError naming the tensor.
        The copy is exact (same dtype), so refit preserves bits.
        """
        loaded = []
        for name, full in named_tensors:
            if name not in self.full_shapes:
                raise ValueError(f"engine has no parameter named {name!r}")
            if tuple(full.shape) != self.full_shapes[name]:
                raise ValueError(f"{name}: shape {tuple(full.shape)}, engine expects {self.full_shapes[name]}")
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
        packed = self.layers[layer].qk_norm
        packed[:heads].copy_(self.params[f"{p}.q_norm.weight"].expand(heads, -1))
        packed[heads:].copy_(self.params[f"{p}.k_norm.weight"].expand(packed.shape[0] - heads, -1))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's shards under HF names (``ShardPlan.unshard`` rebuilds full tensors)."""
        return {name: t.detach().clone() for name, t in self.params.items()}
