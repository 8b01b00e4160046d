"""Bucket planning for weight refit: aligned sizes and greedy in-order buckets.

Both halves of a refit (sender and receiver) must agree on where every tensor
lives in a packed buffer, so the sizing rules here are the single source of
truth: a tensor occupies ``calculate_aligned_size(nbytes)`` bytes of a packed
buffer, and buckets are formed greedily in the order the tensors are given.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

ALIGNMENT_BYTES = 512


def calculate_aligned_size(size_bytes: int, alignment: int = ALIGNMENT_BYTES) -> int:
    """Round ``size_bytes`` up to a multiple of ``alignment``.

    Invariants: result >= size, result % alignment == 0, result - size <
    alignment, idempotent, 0 -> 0, monotone non-decreasing in size.
    """
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
    return -(-int(size_bytes) // alignment) * alignment


def tensor_nbytes(tensor: Any) -> int:
    """Unaligned payload size of a tensor: ``numel * element_size``."""
    return int(tensor.numel()) * int(tensor.element_size())


def iter_named_tensor_buckets(
    named_tensors: Iterable[tuple[str, Any]], buffer_size_bytes: int
) -> Iterator[list[tuple[str, Any]]]:
    """Group ``(name, tensor)`` pairs into buckets of at most ``buffer_size_bytes``.

    Greedy and order-preserving: the current bucket is yielded when it is
    non-empty and adding the next tensor would exceed the limit. A tensor
    larger than the limit therefore ends up alone in its bucket. Sizes are
    unaligned (``numel * element_size``). Tensors exposing ``.wait()`` (async
    collectives still in flight) are waited on before they are sized.

    Invariants: concatenating the buckets gives the input order; no bucket is
    empty; every bucket fits the limit or holds exactly one tensor.
    """
    if buffer_size_bytes <= 0:
        raise ValueError(f"buffer_size_bytes must be positive, got {buffer_size_bytes}")
    bucket: list[tuple[str, Any]] = []
    used = 0
    for name, tensor in named_tensors:
        wait = getattr(tensor, "wait", None)
        if callable(wait):
            waited = wait()
            tensor = tensor if waited is None else waited
        size = tensor_nbytes(tensor)
        if bucket and used + size > buffer_size_bytes:
            yield bucket
            bucket, used = [], 0
        bucket.append((name, tensor))
        used += size
    if bucket:
        yield bucket
