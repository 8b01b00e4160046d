"""What a refit into a vLLM engine must send: the full HF-named tensors of the model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.model.config import ModelConfig


def state_dict_info(model_block: Mapping[str, Any]) -> dict:
    """``{hf_name: (full_shape, torch dtype)}`` in model order (the native engine's ``state_dict_info``)."""
    from harness.rollout.sharding import hf_weight_shapes

    cfg = ModelConfig.from_spec(model_block)
    dtype = cfg.torch_dtype()
    return {name: (tuple(shape), dtype) for name, shape in hf_weight_shapes(cfg).items()}
