"""Page-locking host tensors where they lie (``cudaHostRegister``), so a copy from them to
the GPU runs at pinned-memory speed without a second host copy.

A pinned allocation (``pin_memory()``) copies the tensor into the pinned caching
allocator, which rounds every block up (a 2.6 GB set of tensors would hold more and
change the process's RSS); registering the existing pages keeps the same memory and the
same values. The megatron engine registers its reference weights (the GRPO reference
swap copies them in every step after the first). Registration is an optimisation only:
where it fails (no cuda, a driver refusal) the tensors stay pageable and every copy
gives the same bits, so the failure is reported in ``RegisteredPages.error`` and nothing
else changes.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch


class RegisteredPages:
    """The host tensors registered by :func:`register_host_pages`; :meth:`release`
    (also run when this object is collected) unregisters them."""

    def __init__(self) -> None:
        self.pointers: list[int] = []
        self.bytes = 0
        self.error: str | None = None
        self._finalizer = weakref.finalize(self, _unregister, self.pointers)

    def release(self) -> None:
        """Unregister every registered range (idempotent)."""
        self._finalizer()


def _unregister(pointers: list[int]) -> None:
    if not pointers:
        return
    cudart = torch.cuda.cudart()
    for ptr in pointers:
        cudart.cudaHostUnregister(ptr)
    pointers.clear()


def register_host_pages(tensors: Iterable[torch.Tensor]) -> RegisteredPages:
    """Register each non-empty, contiguous, not yet pinned CPU tensor's memory with the
    CUDA driver (``cudaHostRegisterDefault``). The tensors must outlive the returned
    object's :meth:`release` (the caller keeps both). Stops at the first failure, naming
    it in ``error`` (the ranges registered so far stay registered until ``release``)."""
    pages = RegisteredPages()
    if not torch.cuda.is_available():
        pages.error = "cuda is not available"
        return pages
    cudart = torch.cuda.cudart()
    for t in tensors:
        if t.device.type != "cpu" or t.numel() == 0 or not t.is_contiguous() or t.is_pinned():
            continue
        size = t.numel() * t.element_size()
        rc = cudart.cudaHostRegister(t.data_ptr(), size, 0)
        code = int(getattr(rc, "value", rc))
        if code != 0:
            pages.error = f"cudaHostRegister of {size} bytes returned error {code}"
            break
        pages.pointers.append(t.data_ptr())
        pages.bytes += size
    return pages
