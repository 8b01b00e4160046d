"""Tensor-parallel layout of the engine's weights over HF-named full tensors.

The engine shards like vLLM does for Qwen3-MoE: attention heads split across
TP ranks (q/o by query head, k/v by KV head, or KV heads replicated when
``tp > kv_heads``), each expert's intermediate columns split (gate/up rows,
down columns), everything else (embeddings, norms, router, lm_head)
replicated. ``shard`` and ``unshard`` are exact inverses on the full tensor,
so a refit check can compare a gathered engine state with the policy's bit
for bit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from harness.model.config import ModelConfig

_Q = re.compile(r"model\.layers\.\d+\.self_attn\.q_proj\.weight$")
_KV = re.compile(r"model\.layers\.\d+\.self_attn\.[kv]_proj\.weight$")
_O = re.compile(r"model\.layers\.\d+\.self_attn\.o_proj\.weight$")
_GATE_UP = re.compile(r"model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up)_proj\.weight$")
_DOWN = re.compile(r"model\.layers\.\d+\.mlp\.experts\.\d+\.down_proj\.weight$")


def hf_weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every HF parameter name of the model with its full shape, in model order."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab, cfg.hidden)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (cfg.hidden,)
        shapes[f"{p}.self_attn.q_proj.weight"] = (cfg.q_width, cfg.hidden)
        shapes[f"{p}.self_attn.k_proj.weight"] = (cfg.kv_width, cfg.hidden)
        shapes[f"{p}.self_attn.v_proj.weight"] = (cfg.kv_width, cfg.hidden)
        shapes[f"{p}.self_attn.o_proj.weight"] = (cfg.hidden, cfg.q_width)
        if cfg.qk_norm:
            shapes[f"{p}.self_attn.q_norm.weight"] = (cfg.head_dim,)
            shapes[f"{p}.self_attn.k_norm.weight"] = (cfg.head_dim,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (cfg.hidden,)
        shapes[f"{p}.mlp.gate.weight"] = (cfg.experts, cfg.hidden)
        for e in range(cfg.experts):
            shapes[f"{p}.mlp.experts.{e}.gate_proj.weight"] = (cfg.moe_intermediate, cfg.hidden)
            shapes[f"{p}.mlp.experts.{e}.up_proj.weight"] = (cfg.moe_intermediate, cfg.hidden)
            shapes[f"{p}.mlp.experts.{e}.down_proj.weight"] = (cfg.hidden, cfg.moe_intermediate)
    shapes["model.norm.weight"] = (cfg.hidden,)
    shapes["lm_head.weight"] = (cfg.vocab, cfg.hidden)
    return shapes


@dataclass(frozen=True)
class ShardPlan:
    """Where rank ``tp_rank`` of ``tp_size`` takes its slice of each full tensor."""

    cfg: ModelConfig
    tp_rank: int
    tp_size: int

    def __post_init__(self) -> None:
        cfg, tp = self.cfg, self.tp_size
        if tp < 1 or not 0 <= self.tp_rank < tp:
            raise ValueError(f"rollout tp_rank {self.tp_rank} outside [0, {tp})")
        if cfg.heads % tp:
            raise ValueError(f"model.heads ({cfg.heads}) must be divisible by rollout.tp ({tp})")
        if cfg.kv_heads % tp and tp % cfg.kv_heads:
            raise ValueError(
                f"model.kv_heads ({cfg.kv_heads}) and rollout.tp ({tp}) must divide one another"
            )
        if cfg.moe_intermediate % tp:
            raise ValueError(f"model.moe_intermediate ({cfg.moe_intermediate}) must be divisible by rollout.tp ({tp})")

    @property
    def local_heads(self) -> int:
        return self.cfg.heads // self.tp_size

    @property
    def local_kv_heads(self) -> int:
        return max(1, self.cfg.kv_heads // self.tp_size)

    def _kv_head_start(self, rank: int) -> int:
        kv, tp = self.cfg.kv_heads, self.tp_size
        return rank * (kv // tp) if kv >= tp else rank // (tp // kv)

    def _rows(self, name: str, rank: int) -> tuple[int, int, int] | None:
        """(dim, start, length) of rank's slice, or None when replicated."""
        cfg, d = self.cfg, self.cfg.head_dim
        if _Q.search(name):
            return 0, rank * self.local_heads * d, self.local_heads * d
        if _KV.search(name):
            return 0, self._kv_head_start(rank) * d, self.local_kv_heads * d
        if _O.search(name):
            return 1, rank * self.local_heads * d, self.local_heads * d
        inter = cfg.moe_intermediate // self.tp_size
        if _GATE_UP.search(name):
            return 0, rank * inter, inter
        if _DOWN.search(name):
            return 1, rank * inter, inter
        return None

    def shard(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of ``full`` (a view; copy before keeping it)."""
        rows = self._rows(name, self.tp_rank)
        if rows is None or self.tp_size == 1:
            return full
        dim, start, length = rows
        return full.narrow(dim, start, length)

    def local_shape(self, name: str, full_shape: tuple[int, ...]) -> tuple[int, ...]:
        rows = self._rows(name, self.tp_rank)
        if rows is None or self.tp_size == 1:
            return tuple(full_shape)
        dim, _, length = rows
        shape = list(full_shape)
        shape[dim] = length
        return tuple(shape)

    def unshard(self, name: str, shards: list[torch.Tensor]) -> torch.Tensor:
        """Rebuild the full tensor from every rank's shard (``shards[r]`` from rank r)."""
        if len(shards) != self.tp_size:
            raise ValueError(f"{name}: expected {self.tp_size} shards, got {len(shards)}")
        rows = self._rows(name, 0)
        if rows is None or self.tp_size == 1:
            return shards[0]
        dim = rows[0]
        if _KV.search(name) and self.cfg.kv_heads < self.tp_size:
            step = self.tp_size // self.cfg.kv_heads  # replicas of one KV head
            shards = shards[::step]
        return torch.cat(shards, dim=dim)
