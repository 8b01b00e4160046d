"""Shared staging buffers for the colocated refit stream: host file mappings and CUDA IPC.

A staging buffer is a file-backed shared mapping (``torch.from_file(...,
shared=True)``) under ``/dev/shm`` when available (``$HARNESS_REFIT_STAGING_DIR``
overrides), fully allocated when created so a full file system is an error, not a
SIGBUS on first write. Its *handle* is a small
picklable dict ``{"path", "nbytes"}``; a receiver in another process maps
the same file and reads the packed bytes without a copy through the socket,
just as vLLM rebuilds a CUDA tensor from an IPC handle. The creator owns the
file and unlinks it on ``release()``.

On a GPU the sender stages in GPU memory instead (``CudaStagingBuffer``):
its handle is a CUDA IPC export and the receiver rebuilds a device tensor on
the same allocation (``open_cuda_staging``), so no byte crosses host memory.
``open_staging`` opens either kind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass

import torch

STAGING_DIR_ENV = "HARNESS_REFIT_STAGING_DIR"


class StagingSpaceError(RuntimeError):
    """The staging directory cannot hold a buffer (its file system is full or too small)."""


def default_staging_dir() -> str:
    """``$HARNESS_REFIT_STAGING_DIR``, else ``/dev/shm`` when writable (RAM-backed),
    else the system temp dir."""
    chosen = os.environ.get(STAGING_DIR_ENV)
    if chosen:
        return chosen
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


def _reserve(path: str, nbytes: int) -> None:
    """Create ``path`` with all ``nbytes`` allocated, or raise StagingSpaceError.

    A shared mapping of a sparse file gets its pages only when they are first
    written; on a full tmpfs (a container's 64 MiB ``/dev/shm``) that write is a
    SIGBUS that kills the process with no message. Allocating up front turns it
    into an error that names the directory, the sizes and the way out.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        os.close(fd)
        os.unlink(path)
        directory = os.path.dirname(path)
        free = shutil.disk_usage(directory).free
        raise StagingSpaceError(
            f"refit staging buffer of {nbytes} bytes does not fit in {directory} ({free} bytes free: "
            f"{exc.strerror}); give that file system more room (docker run --shm-size for /dev/shm), "
            f"or point {STAGING_DIR_ENV} at a directory that has it"
        ) from None
    os.close(fd)


@dataclass
class StagingBuffer:
    """A ``uint8`` buffer shared through a file mapping; the creator owns the file."""

    path: str
    nbytes: int
    tensor: torch.Tensor

    @classmethod
    def create(cls, nbytes: int, directory: str | None = None) -> StagingBuffer:
        if nbytes <= 0:
            raise ValueError(f"staging buffer size must be positive, got {nbytes}")
        directory = directory or default_staging_dir()
        path = os.path.join(directory, f"harness-refit-{os.getpid()}-{uuid.uuid4().hex[:12]}.buf")
        _reserve(path, nbytes)
        tensor = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        return cls(path=path, nbytes=nbytes, tensor=tensor)

    def handle(self) -> dict:
        """What travels over the socket: enough for another process to map the buffer."""
        return {"path": self.path, "nbytes": self.nbytes}

    def ready(self) -> None:
        """Nothing to wait for: host copies are synchronous (the CUDA buffer's ``ready`` syncs)."""

    def release(self) -> None:
        """Drop the mapping and unlink the file (idempotent)."""
        self.tensor = torch.empty(0, dtype=torch.uint8)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def open_staging(handle: dict) -> torch.Tensor:
    """Map a buffer created by another process from its handle (no copy): a host file
    mapping, or a CUDA buffer for a ``cuda_ipc`` handle (``open_cuda_staging``)."""
    if handle.get("kind") == CUDA_IPC:
        return open_cuda_staging(handle)
    path, nbytes = handle["path"], int(handle["nbytes"])
    if not os.path.exists(path):
        raise RuntimeError(f"refit staging buffer {path} does not exist (sender gone or handle stale)")
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


# -- CUDA IPC (colocated engines on a GPU) ------------------------------------------------
CUDA_IPC = "cuda_ipc"
"""``handle["kind"]`` of a CUDA staging buffer (a host handle has no ``kind``)."""


@dataclass
class CudaStagingBuffer:
    """A ``uint8`` buffer in GPU memory, shared with other processes by CUDA IPC handle.

    The handle is ``{"kind": "cuda_ipc", "nbytes", "id", "ipc": <reduction args>}``
    (``id`` names the buffer, so a receiver opens it once per stream):
    the arguments of ``torch.multiprocessing.reductions.reduce_tensor`` (CUDA
    IPC memory handle, storage size and offset, the producer's reference
    counter and IPC event), all plain picklable values. The creator keeps the
    allocation alive until ``release()``; torch's reference counting defers
    freeing the memory until every process that opened it dropped it.
    """

    nbytes: int
    tensor: torch.Tensor
    id: str = ""
    _ipc: tuple | None = None

    @classmethod
    def create(cls, nbytes: int, device: torch.device | str = "cuda") -> CudaStagingBuffer:
        if nbytes <= 0:
            raise ValueError(f"staging buffer size must be positive, got {nbytes}")
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"a CUDA staging buffer needs a cuda device, got {device}")
        return cls(nbytes=nbytes, tensor=torch.empty(nbytes, dtype=torch.uint8, device=device),
                   id=f"{os.getpid()}-{uuid.uuid4().hex[:12]}")

    def handle(self) -> dict:
        """What travels over the socket (computed once per buffer: one IPC export)."""
        if self._ipc is None:
            from torch.multiprocessing.reductions import reduce_tensor

            _, self._ipc = reduce_tensor(self.tensor)
        return {"kind": CUDA_IPC, "nbytes": self.nbytes, "id": self.id, "ipc": self._ipc}

    def ready(self) -> None:
        """Wait until the packing copies on this device finished (before the handle is sent)."""
        torch.cuda.current_stream(self.tensor.device).synchronize()

    def release(self) -> None:
        """Drop this process's reference to the allocation (idempotent)."""
        self.tensor = torch.empty(0, dtype=torch.uint8)
        self._ipc = None


def open_cuda_staging(handle: dict) -> torch.Tensor:
    """Rebuild a CUDA staging buffer from its handle in another process (no copy).

    Raises RuntimeError naming the buffer size when the handle cannot be opened
    (a process on another GPU, or the same process that exported it: CUDA IPC
    opens handles of *other* processes only).
    """
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    try:
        return rebuild_cuda_tensor(*handle["ipc"])
    except Exception as exc:
        raise RuntimeError(
            f"refit CUDA IPC staging buffer of {handle.get('nbytes')} bytes could not be opened: {exc}"
        ) from exc
