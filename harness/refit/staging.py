"""Shared staging buffers for the colocated refit stream (the CPU analogue of CUDA IPC).

A staging buffer is a file-backed shared mapping (``torch.from_file(...,
shared=True)``) under ``/dev/shm`` when available. Its *handle* is a small
picklable dict ``{"path", "nbytes"}``; a receiver in another process maps
the same file and reads the packed bytes without a copy through the socket,
just as vLLM rebuilds a CUDA tensor from an IPC handle. The creator owns the
file and unlinks it on ``release()``.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass

import torch


def default_staging_dir() -> str:
    """``/dev/shm`` when writable (RAM-backed), else the system temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


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
