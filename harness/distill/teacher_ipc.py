"""Teacher logits by IPC for on-policy distillation: one growable buffer, per-sample handles.

A teacher worker writes the logits of its microbatches into one
``[N_mb, B, T, V]`` buffer that the student's process opens without a copy:

* :func:`ensure_teacher_ipc_buffer` allocates it lazily and keeps it while
  every request fits: same dtype and device, and no dimension larger than the
  buffer's. Otherwise it allocates a new buffer and exports a new handle. While
  dtype and device stay, the new shape is the elementwise maximum of the old
  one and the request (a buffer never shrinks, so alternating request shapes
  reallocate at most once per dimension's new maximum); a dtype or device change
  allocates exactly the request.
* A :class:`TeacherHandle` is plain picklable data (Ray, queues, pickle) that
  :func:`open_teacher_handle` turns back into a tensor aliasing the buffer, in
  another process on the same host. On CPU the buffer is shared memory
  (``share_memory_()``, torch's default ``file_descriptor`` form): the handle
  names the owner's pid and the storage's file descriptor, and a reader maps
  ``/proc/<pid>/fd/<fd>`` (``UntypedStorage.from_file``), so no descriptor
  passing is needed and any number of processes can open it while the owner
  lives (a reader's mapping stays valid after that); on CUDA it is a CUDA IPC
  handle of the storage (torch's own CUDA reduction). The interface is the same.
* :func:`per_sample_handles` names each sample's ``[T, V]`` slice (local
  sample order: microbatch-major), and :func:`aggregate_teacher_handles`
  regroups the results of all teacher workers (TP x CP replicas share a DP
  rank) into global-batch order, independent of the teacher's DP degree
  (``harness.refit.handles.aggregate_per_sample_handles``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from harness.refit.handles import aggregate_per_sample_handles


@dataclass(frozen=True)
class TeacherHandle:
    """Where a teacher buffer lives: ``kind`` ``"cpu_fd"`` or ``"cuda_ipc"``, its tensor geometry, and
    ``owner``, the pid of the exporting process (which holds one buffer at a time)."""

    kind: str
    payload: tuple
    shape: tuple[int, ...]
    dtype: str
    device: str
    owner: int = 0


@dataclass(frozen=True)
class SampleRef:
    """One sample's logits: ``buffer[microbatch, row, :seq_len, :vocab]`` of the buffer ``handle`` names."""

    handle: TeacherHandle
    microbatch: int
    row: int
    seq_len: int
    vocab: int


def _dtype(text: str) -> torch.dtype:
    value = getattr(torch, text.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"teacher handle: not a torch dtype: {text!r}")
    return value


def export_handle(storage: torch.Tensor) -> TeacherHandle:
    """Export a contiguous buffer (CPU: put into shared memory first) as a :class:`TeacherHandle`."""
    if not storage.is_contiguous() or storage.storage_offset() != 0:
        raise ValueError("a teacher buffer must be a contiguous tensor at offset 0")
    shape, dtype, device = tuple(storage.shape), str(storage.dtype), str(storage.device)
    if storage.device.type == "cuda":
        from torch.multiprocessing.reductions import reduce_tensor

        _, args = reduce_tensor(storage)
        return TeacherHandle("cuda_ipc", tuple(args), shape, dtype, device, os.getpid())
    if storage.device.type != "cpu":
        raise ValueError(f"teacher buffers live on cpu or cuda, not {storage.device}")
    storage.share_memory_()
    fd, nbytes = storage.untyped_storage()._share_fd_cpu_()
    return TeacherHandle("cpu_fd", (os.getpid(), int(fd), int(nbytes)), shape, dtype, device, os.getpid())


def open_teacher_handle(handle: TeacherHandle) -> torch.Tensor:
    """The buffer ``handle`` names, as a tensor sharing its memory (no copy)."""
    if handle.kind == "cuda_ipc":
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        return rebuild_cuda_tensor(*handle.payload)
    if handle.kind != "cpu_fd":
        raise ValueError(f"teacher handle kind {handle.kind!r} is not cpu_fd or cuda_ipc")
    pid, fd, nbytes = handle.payload
    path = f"/proc/{pid}/fd/{fd}"
    try:
        storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes)
    except RuntimeError as exc:
        raise RuntimeError(f"teacher handle: cannot map {path} (has the teacher process {pid} exited?): "
                           f"{exc}") from exc
    dtype = _dtype(handle.dtype)
    numel = 1
    for d in handle.shape:
        numel *= d
    if numel * dtype.itemsize > nbytes:
        raise ValueError(f"teacher handle: shape {handle.shape} of {handle.dtype} exceeds its {nbytes} bytes")
    return torch.empty(0, dtype=dtype).set_(storage, 0, handle.shape)


def ensure_teacher_ipc_buffer(
    storage: torch.Tensor | None,
    handle: TeacherHandle | None,
    num_microbatches: int,
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> tuple[torch.Tensor, TeacherHandle]:
    """The buffer to write ``[num_microbatches, batch_size, seq_len, vocab_size]`` logits into, and its handle.

    Returns ``(storage, handle)`` unchanged (the same objects) when the request
    fits; otherwise a new buffer and a newly exported handle (see the module
    docstring for the new shape). Sizes must be positive ints (ValueError
    naming the dimension).
    """
    want = (num_microbatches, batch_size, seq_len, vocab_size)
    for label, n in zip(("num_microbatches", "batch_size", "seq_len", "vocab_size"), want):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"teacher buffer {label} must be a positive int, got {n!r}")
    device = torch.device(device)
    if storage is not None and handle is not None and storage.dtype == dtype and storage.device == device:
        if all(have >= need for have, need in zip(storage.shape, want)):
            return storage, handle
        shape = tuple(max(have, need) for have, need in zip(storage.shape, want))
    else:
        shape = want
    fresh = torch.zeros(shape, dtype=dtype, device=device)
    return fresh, export_handle(fresh)


def teacher_view(storage: torch.Tensor, num_microbatches: int, batch_size: int, seq_len: int,
                 vocab_size: int) -> torch.Tensor:
    """The ``[num_microbatches, batch_size, seq_len, vocab_size]`` corner of a (possibly larger) buffer."""
    return storage[:num_microbatches, :batch_size, :seq_len, :vocab_size]


def per_sample_handles(handle: TeacherHandle, num_microbatches: int, batch_size: int, seq_len: int,
                       vocab_size: int) -> list[SampleRef]:
    """One :class:`SampleRef` per local sample, microbatch-major (sample ``m * batch_size + r``)."""
    return [SampleRef(handle, m, r, seq_len, vocab_size) for m in range(num_microbatches) for r in range(batch_size)]


def read_sample(ref: SampleRef, opened: dict[TeacherHandle, torch.Tensor] | None = None) -> torch.Tensor:
    """The ``[seq_len, vocab]`` logits ``ref`` names (a view; ``opened`` caches opened buffers)."""
    cache = {} if opened is None else opened
    if ref.handle not in cache:
        cache[ref.handle] = open_teacher_handle(ref.handle)
    return cache[ref.handle][ref.microbatch, ref.row, : ref.seq_len, : ref.vocab]


def aggregate_teacher_handles(worker_results: Iterable[Mapping[str, Any]]) -> list[dict[str, list[Any]]]:
    """Global-batch-ordered ``[{"teacher_shards": [shard per TP x CP replica]}, ...]`` from every worker's
    ``{"dp_rank", "per_sample_handles"}`` (sorted dp-rank order; see ``harness.refit.handles``)."""
    return aggregate_per_sample_handles(worker_results)
