"""Byte-exact tensor encoding for bulk staging (the `dataplane` trainer).

A dict of tensors becomes (meta, payload): `meta` lists, in sorted name order,
each tensor's name, dtype name, shape, byte offset and length; `payload` is the
concatenation of their contiguous CPU bytes. Decoding gives tensors equal bit
for bit (NaN payloads included) with the same dtype and shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

_DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float32, torch.float64, torch.float16, torch.bfloat16,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    )
}


def encode_tensors(key: str, tensors: Mapping[str, Any]) -> tuple[list[dict[str, Any]], bytes]:
    if not isinstance(tensors, Mapping) or not tensors:
        raise ValueError(f"put_tensors({key!r}): expected a non-empty dict of tensors")
    meta: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"put_tensors({key!r}): field {name!r} is {type(t).__name__}, not a torch.Tensor")
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise TypeError(f"put_tensors({key!r}): field {name!r} has unsupported dtype {t.dtype}")
        t = t.detach().to("cpu").contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() and t.dim() else _scalar_bytes(t)
        meta.append({"name": name, "dtype": dtype, "shape": list(t.shape), "offset": offset, "nbytes": len(raw)})
        chunks.append(raw)
        offset += len(raw)
    return meta, b"".join(chunks)


def _scalar_bytes(t: torch.Tensor) -> bytes:
    if t.numel() == 0:
        return b""
    return t.reshape(1).view(torch.uint8).numpy().tobytes()


def decode_tensors(key: str, meta: list[dict[str, Any]], payload: bytes) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for entry in meta:
        name, dtype = entry["name"], _DTYPES[entry["dtype"]]
        raw = payload[entry["offset"] : entry["offset"] + entry["nbytes"]]
        if entry["nbytes"] == 0:
            out[name] = torch.empty(entry["shape"], dtype=dtype)
            continue
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
        out[name] = flat.reshape(entry["shape"]).clone()
    return out
