"""What a refit into a vLLM engine must send, and how held weights come back out of a worker.

``collective_rpc`` results from vLLM's own processes travel through vLLM's
msgpack codec, which turns a tensor into a plain ``[dtype, shape, data]``
list on the way back (tensor types are only restored with
``VLLM_ALLOW_INSECURE_SERIALIZATION``). So workers return their held weights
as ``torch.save`` bytes (``pack_state``) and the engine owner decodes them
(``unpack_state``, ``weights_only``); the same bytes work in-process.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from harness.model.config import ModelConfig


def state_dict_info(model: ModelConfig | Mapping[str, Any]) -> dict:
    """``{hf_name: (full_shape, torch dtype)}`` in model order (the native engine's ``state_dict_info``)
    of a model config or a ``model`` block."""
    from harness.rollout.sharding import hf_weight_shapes

    cfg = model if isinstance(model, ModelConfig) else ModelConfig.from_spec(model)
    dtype = cfg.torch_dtype()
    return {name: (tuple(shape), dtype) for name, shape in hf_weight_shapes(cfg).items()}


def pack_state(tensors: Mapping[str, Any]) -> bytes:
    """``{name: tensor}`` as ``torch.save`` bytes of host tensors (transport-safe through
    ``collective_rpc``; decoded by a process without a GPU too)."""
    import torch

    buffer = io.BytesIO()  # device tensors (a GPU worker's) go as host copies; host tensors as they are
    torch.save({k: v if v.device.type == "cpu" else v.cpu() for k, v in tensors.items()}, buffer)
    return buffer.getvalue()


def unpack_state(payload: bytes) -> dict:
    """Inverse of ``pack_state``; a non-bytes payload is a clear ``TypeError``."""
    import torch

    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"vLLM worker returned {type(payload).__name__} for harness_state_dict, expected bytes")
    return torch.load(io.BytesIO(bytes(payload)), weights_only=True)
