"""Shared staging buffers for the colocated refit stream (the CPU analogue of CUDA IPC).

A staging buffer is a file-backed shared mapping (``torch.from_file(...,
shared=True)``) under ``/dev/shm`` when available (``$HARNESS_REFIT_STAGING_DIR``
overrides), fully allocated when created so a full file system is an error, not a
SIGBUS on first write. Its *handle* is a small
picklable dict ``{"path", "nbytes"}``; a receiver in another process maps
the same file and reads the packed bytes without a copy through the socket,
just as vLLM rebuilds a CUDA tensor from an IPC handle. The creator owns the
file and unlinks it on ``release()``.
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

    def release(self) -> None:
        """Drop the mapping and unlink the file (idempotent)."""
        self.tensor = torch.empty(0, dtype=torch.uint8)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def open_staging(handle: dict) -> torch.Tensor:
    """Map a buffer created by another process from its handle (no copy)."""
    path, nbytes = handle["path"], int(handle["nbytes"])
    if not os.path.exists(path):
        raise RuntimeError(f"refit staging buffer {path} does not exist (sender gone or handle stale)")
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
