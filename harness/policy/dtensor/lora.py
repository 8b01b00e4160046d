"""LoRA adapters for the dtensor backend (`policy.lora`).

`LoRALinear` wraps a frozen `nn.Linear` as ``base``; its output is
``base(x) + scale * lora_B(lora_A(dropout(x)))`` with ``scale = alpha / rank``.
``lora_A`` is drawn from a generator seeded by (spec seed, module name), so every
rank builds the same adapters; ``lora_B`` starts at zero, so the initial model is
the base model. Only the attention projections take adapters
(`SUPPORTED_TARGETS`): the reference experts read their weights directly and
never call their `nn.Linear` modules.

Dropout masks come from a generator seeded by (seed, dp coordinate), advanced
each call, so tensor-parallel peers draw the same masks (their replicated
adapter gradients stay equal).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from harness.spec.typed import LoraSpec, as_mapping

SUPPORTED_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
DEFAULTS: dict[str, Any] = {"enabled": False, "rank": 8, "alpha": 16.0, "dropout": 0.0,
                            "target_modules": list(SUPPORTED_TARGETS)}


def lora_config(lora: LoraSpec | None) -> dict[str, Any]:
    """`policy.lora` (the typed block; None: absent) with defaults filled in; raises
    ValueError naming the field."""
    cfg = {**DEFAULTS, **(as_mapping(lora) if lora is not None else {})}
    bad = [t for t in cfg["target_modules"] if t not in SUPPORTED_TARGETS]
    if bad:
        raise ValueError(f"policy.lora.target_modules: {bad} not supported by the dtensor backend "
                         f"(supported: {list(SUPPORTED_TARGETS)})")
    if int(cfg["rank"]) < 1:
        raise ValueError(f"policy.lora.rank must be >= 1, got {cfg['rank']}")
    if not 0.0 <= float(cfg["dropout"]) < 1.0:
        raise ValueError(f"policy.lora.dropout must be in [0, 1), got {cfg['dropout']}")
    return cfg


def _name_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float, *, seed: int, name: str,
                 dropout_gen: torch.Generator | None) -> None:
        super().__init__()
        self.base = base
        self.base.weight.requires_grad_(False)
        self.scale = float(alpha) / int(rank)
        self.dropout = float(dropout)
        self.dropout_gen = dropout_gen
        dtype = base.weight.dtype
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, dtype=dtype)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, dtype=dtype)
        gen = torch.Generator().manual_seed(_name_seed(seed, name))
        bound = 1.0 / math.sqrt(base.in_features)
        with torch.no_grad():
            self.lora_A.weight.copy_(torch.rand(self.lora_A.weight.shape, generator=gen).mul_(2 * bound).sub_(bound))
            self.lora_B.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        if self.training and self.dropout > 0.0:
            keep = torch.rand(x.shape, generator=self.dropout_gen, dtype=torch.float32) >= self.dropout
            h = x * keep.to(device=x.device, dtype=x.dtype) / (1.0 - self.dropout)
        return self.base(x) + self.scale * self.lora_B(self.lora_A(h))


def apply_lora(model: nn.Module, cfg: Mapping[str, Any], seed: int, dp_coord: int) -> list[str]:
    """Freeze every parameter of `model` and wrap the target projections in
    `LoRALinear` (in place). Returns the wrapped module names."""
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(_name_seed(seed, f"dropout:{dp_coord}"))
    targets = set(cfg["target_modules"])
    wrapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in targets and isinstance(child, nn.Linear):
                full = f"{name}.{child_name}" if name else child_name
                setattr(module, child_name, LoRALinear(child, int(cfg["rank"]), float(cfg["alpha"]),
                                                       float(cfg["dropout"]), seed=seed, name=full, dropout_gen=gen))
                wrapped.append(full)
    return wrapped


def merged_weight(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """``base + scale * B @ A`` (full tensors), in the base weight's dtype."""
    return (base + scale * (b @ a)).to(base.dtype)
