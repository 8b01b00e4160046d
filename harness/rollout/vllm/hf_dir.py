"""The engine's initial weights as a Hugging Face model directory (vLLM's input).

``write_hf_dir(cfg, directory, weights)`` writes ``config.json``
(``Qwen3MoeForCausalLM``, from ``ModelConfig.to_hf_dict``) and
``model.safetensors`` (HF parameter names, the dtype of ``model.dtype``).
The directory is a pure function of the model config and the weights; no tokenizer
is written (the engine runs with ``skip_tokenizer_init=True`` on token ids).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from harness.model.config import ModelConfig


def hf_config(cfg: ModelConfig, eos_token_id: int | None) -> dict[str, Any]:
    """``config.json`` contents for the model ``cfg``."""
    doc = cfg.to_hf_dict()
    doc.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", torch_dtype=cfg.dtype)
    if eos_token_id is not None:
        doc["eos_token_id"] = int(eos_token_id)
    return doc


def write_hf_dir(cfg: ModelConfig, directory: str, weights: Mapping[str, Any], *,
                 eos_token_id: int | None = None) -> str:
    """Write ``config.json`` + ``model.safetensors`` into ``directory``; returns it.

    ``weights``: every HF-named tensor of the model (``hf_weight_shapes``);
    a missing or extra name raises ``ValueError`` naming it.
    """
    from safetensors.torch import save_file

    from harness.rollout.sharding import hf_weight_shapes

    expected = hf_weight_shapes(cfg)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise ValueError(f"HF weights for vLLM: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != tuple(shape):
            raise ValueError(f"HF weight {name}: shape {tuple(weights[name].shape)}, expected {tuple(shape)}")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config(cfg, eos_token_id), f, indent=1, sort_keys=True)
    dtype = cfg.torch_dtype()
    save_file({n: weights[n].detach().to(dtype).contiguous() for n in expected},
              os.path.join(directory, "model.safetensors"))
    return directory
