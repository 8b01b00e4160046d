"""Pack a group of tensors into one ``uint8`` buffer at 512-byte aligned offsets.

Layout contract (shared by every transport): tensors are laid out in the
given order; tensor ``i`` starts at ``sum(aligned(nbytes_j) for j < i)`` and
the group's ``used_bytes`` is the sum of all aligned sizes. The receiver
rebuilds views from ``(shape, dtype)`` metadata alone, so it never needs the
sender's offsets; ``unpack_views`` checks that both ends agree on
``used_bytes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from harness.refit.buckets import ALIGNMENT_BYTES, calculate_aligned_size, tensor_nbytes

TensorInfo = tuple[tuple[int, ...], torch.dtype]
"""``(shape, dtype)`` of a full (unsharded) tensor, as in ``state_dict_info``."""


def packed_size(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes a group occupies when packed: the sum of aligned tensor sizes."""
    return sum(calculate_aligned_size(tensor_nbytes(t)) for t in tensors)


def info_nbytes(info: TensorInfo) -> int:
    """Unaligned byte size of a tensor described by ``(shape, dtype)``."""
    shape, dtype = info
    numel = 1
    for dim in shape:
        numel *= int(dim)
    return numel * dtype.itemsize


def pack_into(buffer: torch.Tensor, tensors: Sequence[torch.Tensor], *, batched: bool | None = None) -> int:
    """Byte-copy ``tensors`` into ``buffer`` (1-D ``uint8``); return ``used_bytes``.

    Non-contiguous inputs are fine (they are made contiguous for the copy).
    Raises ValueError when the group does not fit. ``batched`` (default: when
    ``buffer`` is on a GPU) issues the copies as one ``torch._foreach_copy_``
    per dtype over typed views of the buffer instead of one ``copy_`` per
    tensor: the same bytes at the same offsets, a few kernel launches instead
    of one per tensor (the GPU refit's cost was the launches, not bandwidth).
    A host buffer keeps the per-tensor loop unless asked.
    """
    if buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise ValueError("pack buffer must be a 1-D uint8 tensor")
    need = packed_size(tensors)
    if need > buffer.numel():
        raise ValueError(f"group needs {need} bytes but the buffer holds {buffer.numel()}")
    if batched if batched is not None else buffer.device.type == "cuda":
        return _pack_batched(buffer, tensors)
    offset = 0
    for tensor in tensors:
        nbytes = tensor_nbytes(tensor)
        if nbytes:
            flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            buffer[offset : offset + nbytes].copy_(flat)
        offset += calculate_aligned_size(nbytes)
    return offset


def _pack_batched(buffer: torch.Tensor, tensors: Sequence[torch.Tensor]) -> int:
    """``pack_into``'s layout with one ``_foreach_copy_`` per dtype (offsets are
    512-byte aligned, so a slice of the buffer views as any dtype)."""
    if buffer.storage_offset() % ALIGNMENT_BYTES:  # typed views need an aligned start: bytes then
        tensors = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    by_dtype: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    offset = 0
    for tensor in tensors:
        nbytes = tensor_nbytes(tensor)
        if nbytes:
            dst, src = by_dtype.setdefault(tensor.dtype, ([], []))
            dst.append(buffer[offset : offset + nbytes].view(tensor.dtype))
            src.append(tensor.detach().reshape(-1))
        offset += calculate_aligned_size(nbytes)
    for dst, src in by_dtype.values():
        torch._foreach_copy_(dst, src)
    return offset


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Pack into a freshly allocated buffer of exactly ``packed_size`` bytes."""
    buffer = torch.zeros(packed_size(tensors), dtype=torch.uint8)
    pack_into(buffer, tensors)
    return buffer


def unpack_views(
    buffer: torch.Tensor,
    names: Sequence[str],
    state_dict_info: Mapping[str, TensorInfo],
    used_bytes: int | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """Rebuild ``(name, view)`` pairs from a packed buffer.

    The views alias ``buffer``; copy them before the buffer is reused. When
    ``used_bytes`` is given, the offsets implied by the metadata must end
    exactly there (a mismatch means sender and receiver disagree on shapes or
    dtypes) and a RuntimeError names the group's first tensor.
    """
    views: list[tuple[str, torch.Tensor]] = []
    offset = 0
    for name in names:
        if name not in state_dict_info:
            raise KeyError(f"no (shape, dtype) metadata for tensor {name!r}")
        shape, dtype = state_dict_info[name]
        nbytes = info_nbytes((shape, dtype))
        if offset + nbytes > buffer.numel():
            raise RuntimeError(
                f"packed buffer too small for {name!r}: need {offset + nbytes} bytes, have {buffer.numel()}"
            )
        raw = buffer[offset : offset + nbytes]
        views.append((name, raw.view(dtype).reshape(tuple(shape))))
        offset += calculate_aligned_size(nbytes)
    if used_bytes is not None and offset != used_bytes:
        first = names[0] if names else "<empty group>"
        raise RuntimeError(
            f"packed group starting at {first!r}: receiver metadata implies {offset} bytes "
            f"but the sender packed {used_bytes}"
        )
    return views
