"""The small decode model the engine's kernel tests share (probe, invariant kernels).

Big enough for every decode path to matter (8 experts top-2, GQA 8/2 heads, two
layers), small enough that an engine starts in milliseconds on one CPU thread.
"""

from __future__ import annotations

import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model

DECODE_CFG = ModelConfig(layers=2, hidden=64, heads=8, kv_heads=2, head_dim=16, experts=8, top_k=2,
                         moe_intermediate=32, vocab=256, max_position=128)


def reference_weights(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """The reference model's deterministic init for ``seed``, as the engine's full weights."""
    return {n: t.detach() for n, t in build_reference_model(cfg, seed=seed).state_dict().items()}
