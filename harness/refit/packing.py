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
    sized = [(t, tensor_nbytes(t)) for t in tensors]
    slots = [(nbytes, calculate_aligned_size(nbytes)) for _, nbytes in sized]
    used = sum(aligned for _, aligned in slots)
    pairs: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    dtypes = {t.dtype for t in tensors}
    views = _slot_views(buffer, slots, dtypes.pop()) if len(dtypes) == 1 else None
    if views is not None:  # one dtype: every destination view from one split
        pairs[tensors[0].dtype] = ([v for v, (_, n) in zip(views, sized) if n],
                                   [t.reshape(-1) for t, n in sized if n])
    else:
        if buffer.storage_offset() % ALIGNMENT_BYTES:  # typed views need an aligned start: bytes then
            sized = [(t.detach().contiguous().reshape(-1).view(torch.uint8), n) for t, n in sized]
        offset = 0
        for (tensor, nbytes), (_, aligned) in zip(sized, slots):
            if nbytes:
                dst, src = pairs.setdefault(tensor.dtype, ([], []))
                dst.append(buffer[offset : offset + nbytes].view(tensor.dtype))
                src.append(tensor.reshape(-1))
            offset += aligned
    with torch.no_grad():  # parameters may require grad; the staging copy is no autograd op
        for dst, src in pairs.values():
            torch._foreach_copy_(dst, src)
    return used


def _slot_views(buffer: torch.Tensor, slots: Sequence[tuple[int, int]],
                dtype: torch.dtype) -> list[torch.Tensor] | None:
    """Flat ``dtype`` views of consecutive slots ``(nbytes, aligned_nbytes)`` from byte 0 of
    ``buffer``, made by one ``split_with_sizes`` (not one slice and view per tensor);
    None when the buffer's start is not aligned or the slots run past its end."""
    end = sum(aligned for _, aligned in slots)
    if buffer.storage_offset() % ALIGNMENT_BYTES or end > buffer.numel():
        return None
    size = dtype.itemsize
    sizes = [part for nbytes, aligned in slots for part in (nbytes // size, (aligned - nbytes) // size)]
    return list(buffer[:end].view(dtype).split_with_sizes(sizes)[0::2])


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
    *,
    split: bool | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """Rebuild ``(name, view)`` pairs from a packed buffer.

    The views alias ``buffer``; copy them before the buffer is reused. When
    ``used_bytes`` is given, the offsets implied by the metadata must end
    exactly there (a mismatch means sender and receiver disagree on shapes or
    dtypes) and a RuntimeError names the group's first tensor. ``split``
    (default: when ``buffer`` is on a GPU) builds the views of a one-dtype
    group with one ``split_with_sizes``; the views are the same either way.
    """
    layout: list[tuple[str, tuple[int, ...], torch.dtype, int, int]] = []  # name, shape, dtype, offset, nbytes
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
        layout.append((name, tuple(shape), dtype, offset, nbytes))
        offset += calculate_aligned_size(nbytes)
    if used_bytes is not None and offset != used_bytes:
        first = names[0] if names else "<empty group>"
        raise RuntimeError(
            f"packed group starting at {first!r}: receiver metadata implies {offset} bytes "
            f"but the sender packed {used_bytes}"
        )
    dtypes = {dtype for _, _, dtype, _, _ in layout}
    if (split if split is not None else buffer.device.type == "cuda") and len(dtypes) == 1:
        flat = _slot_views(buffer, [(n, calculate_aligned_size(n)) for *_, n in layout], dtypes.pop())
        if flat is not None:  # one split instead of a slice and a view per tensor (GPU refit)
            return [(name, view.view(shape)) for (name, shape, *_), view in zip(layout, flat)]
    return [(name, buffer[start : start + nbytes].view(dtype).reshape(shape))
            for name, shape, dtype, start, nbytes in layout]
