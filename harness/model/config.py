"""`ModelConfig`: the spec's `model` block as a typed, validated dataclass.

Field names are the spec's (docs/design.md, "Workload spec"); `to_hf_dict()`
maps them onto `transformers.Qwen3MoeConfig` keyword arguments. Every Qwen3
field whose HF class default differs from the real checkpoints (head_dim,
norm_topk_prob, rope theta, max positions, layers) is passed explicitly, so
an HF model built from `to_hf_dict()` is the same network as ours.

Invariants checked by `__post_init__` (a bad value raises `ValueError`
naming `model.<field>`):
- every size is a positive int; `head_dim` is even (RoPE rotates halves);
- `heads % kv_heads == 0` (GQA groups), `1 <= top_k <= experts`;
- `dtype` is one of the names in `DTYPES`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Spec dtype name -> torch dtype attribute name (resolved lazily so this
# module does not import torch).
DTYPES: dict[str, str] = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "float64": "float64"}

_POSITIVE_INTS = (
    "layers", "hidden", "heads", "kv_heads", "head_dim", "experts", "top_k",
    "moe_intermediate", "vocab", "max_position",
)


@dataclass(frozen=True)
class ModelConfig:
    """A Qwen3-MoE architecture. Every layer is an MoE layer (no dense MLP,
    no shared expert), embeddings are untied, no linear has a bias."""

    layers: int = 4
    hidden: int = 64
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 16
    experts: int = 8
    top_k: int = 2
    moe_intermediate: int = 32
    vocab: int = 256
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1.0e-6
    norm_topk_prob: bool = True
    qk_norm: bool = True
    max_position: int = 512
    init_std: float = 0.02
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"model.{name} must be a positive int, got {value!r}")
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim must be even for RoPE, got {self.head_dim}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"model.heads ({self.heads}) must be a multiple of model.kv_heads ({self.kv_heads})"
            )
        if self.top_k > self.experts:
            raise ValueError(f"model.top_k ({self.top_k}) must be <= model.experts ({self.experts})")
        for name in ("rope_theta", "rms_eps", "init_std"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"model.{name} must be a positive number, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")

    # -- construction -----------------------------------------------------

    @classmethod
    def from_spec(cls, spec_or_model_block: Mapping[str, Any]) -> ModelConfig:
        """Build from a loaded `Workload` or its `model` block (`harness.spec.typed`), a
        whole spec dict (uses its `model`) or the `model` block dict. Unknown keys raise
        `ValueError` naming them."""
        if dataclasses.is_dataclass(spec_or_model_block):  # a typed Workload or its ModelSpec
            block = getattr(spec_or_model_block, "model", spec_or_model_block)
            return cls(**{f.name: getattr(block, f.name) for f in dataclasses.fields(block)})
        block = spec_or_model_block.get("model", spec_or_model_block)
        if not isinstance(block, Mapping):
            raise ValueError(f"model must be a mapping, got {type(block).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(block) - known)
        if unknown:
            raise ValueError(f"unknown model field(s): {', '.join('model.' + k for k in unknown)}")
        return cls(**dict(block))

    def to_dict(self) -> dict[str, Any]:
        """The spec `model` block (round-trips through `from_spec`)."""
        return dataclasses.asdict(self)

    # -- derived sizes ------------------------------------------------------

    @property
    def q_width(self) -> int:
        """Width of the query projection output (heads * head_dim); may differ from hidden."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def kv_groups(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.heads // self.kv_heads

    def torch_dtype(self):  # -> torch.dtype, without importing torch at module level
        import torch

        return getattr(torch, DTYPES[self.dtype])

    # -- transformers ---------------------------------------------------------

    def to_hf_dict(self) -> dict[str, Any]:
        """Keyword arguments for `transformers.Qwen3MoeConfig(**kw)`.

        The router aux loss is off (`output_router_logits=False`) as in RL
        recipes; pass `output_router_logits=True` yourself to get it.
        Raises `ValueError` for `qk_norm=False`: HF's Qwen3-MoE always has it."""
        if not self.qk_norm:
            raise ValueError("model.qk_norm=false has no transformers Qwen3-MoE equivalent")
        return {
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": 4 * self.hidden,  # dense MLP width; unused (every layer is MoE)
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position,
            "initializer_range": self.init_std,
            "rms_norm_eps": self.rms_eps,
            "use_cache": False,
            "tie_word_embeddings": False,
            "rope_theta": float(self.rope_theta),
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "moe_intermediate_size": self.moe_intermediate,
            "num_experts_per_tok": self.top_k,
            "num_experts": self.experts,
            "norm_topk_prob": self.norm_topk_prob,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        }
