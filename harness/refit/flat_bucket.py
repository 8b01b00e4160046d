"""One-dtype flattened tensor buckets: the payload of a colocated (SGLang-style) refit.

A refit bucket of ``(name, tensor)`` pairs is split by dtype
(:func:`group_by_dtype`); each one-dtype group becomes a
:class:`FlattenedBucket`: the tensors' elements concatenated into one 1-D
tensor of that dtype plus, per tensor, its name, shape and element range.
:func:`reconstruct` turns a payload back into ``(name, view)`` pairs whose
bits equal the originals (concatenation and views copy or alias elements of
one dtype; nothing is converted).

A payload is a plain dict ``{"flattened_tensor": Tensor, "metadata": [...]}``
(picklable: ``dist.gather_object`` and Ray carry it; a CUDA tensor in it
travels as a CUDA IPC handle under torch's multiprocessing pickler).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

LOAD_FORMAT = "flattened_bucket"  # SGLang's load_format name for this payload


@dataclass(frozen=True)
class FlatEntry:
    """Where one tensor lives in a flattened bucket: elements ``[start, end)``."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # e.g. "torch.bfloat16"
    start: int
    end: int


def dtype_from_str(text: str) -> torch.dtype:
    """``"torch.bfloat16"`` or ``"bfloat16"`` -> ``torch.bfloat16``; ValueError otherwise."""
    value = getattr(torch, str(text).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"not a torch dtype: {text!r}")
    return value


Named = list[tuple[str, torch.Tensor]]


def group_by_dtype(bucket: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[torch.dtype, Named]]:
    """Split a bucket by dtype: groups in order of each dtype's first tensor, tensors in bucket order."""
    groups: dict[torch.dtype, Named] = {}
    for name, tensor in bucket:
        groups.setdefault(tensor.dtype, []).append((name, tensor))
    return list(groups.items())


class FlattenedBucket:
    """The tensors of one dtype as one flat tensor plus their :class:`FlatEntry` list."""

    def __init__(self, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        if not named_tensors:
            raise ValueError("a flattened bucket needs at least one tensor")
        dtypes = {t.dtype for _, t in named_tensors}
        if len(dtypes) != 1:
            raise ValueError(f"a flattened bucket holds one dtype, got {sorted(map(str, dtypes))}")
        entries: list[FlatEntry] = []
        start = 0
        for name, tensor in named_tensors:
            end = start + tensor.numel()
            entries.append(FlatEntry(name, tuple(tensor.shape), str(tensor.dtype), start, end))
            start = end
        self.flattened_tensor = torch.cat([t.detach().reshape(-1) for _, t in named_tensors])
        self.metadata = entries

    @property
    def dtype(self) -> torch.dtype:
        return self.flattened_tensor.dtype

    def payload(self) -> dict[str, Any]:
        return {"flattened_tensor": self.flattened_tensor, "metadata": list(self.metadata)}


def reconstruct(payload: Mapping[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """``(name, view into the flat tensor)`` per entry; ValueError naming the entry on a bad payload."""
    try:
        flat, metadata = payload["flattened_tensor"], payload["metadata"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a flattened-bucket payload (needs flattened_tensor and metadata): {exc}") from exc
    if not isinstance(flat, torch.Tensor) or flat.dim() != 1:
        raise ValueError("flattened_tensor must be a 1-D tensor")
    out: list[tuple[str, torch.Tensor]] = []
    for entry in metadata:
        numel = 1
        for d in entry.shape:
            numel *= int(d)
        if dtype_from_str(entry.dtype) != flat.dtype:
            raise ValueError(f"{entry.name}: dtype {entry.dtype} in a {flat.dtype} bucket")
        if not 0 <= entry.start <= entry.end <= flat.numel() or entry.end - entry.start != numel:
            raise ValueError(f"{entry.name}: elements [{entry.start}, {entry.end}) do not fit shape "
                             f"{tuple(entry.shape)} in a bucket of {flat.numel()}")
        out.append((entry.name, flat[entry.start:entry.end].view(tuple(entry.shape))))
    return out
