"""Where tensors live: the CPU (gloo) or a cuda GPU (NCCL).

Tensors cross process and actor boundaries on the CPU; each engine moves what
it computes on to its own device and back. Moves are skipped when the tensor
is already there, so a CPU run dispatches exactly the ops it did before cuda
support existed (the operators surface counts every ``aten::to``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def moved(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; ``t`` itself (no op dispatched) when already there."""
    return t if t.device == device else t.to(device)


def collective_device() -> torch.device:
    """Where scratch tensors for collectives must live: the current cuda device
    when the default process group is NCCL, else the CPU (gloo)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def local_device(rank: int, device: str) -> torch.device:
    """The device a policy rank computes on: the CPU, or cuda GPU
    ``rank % visible GPUs`` (ranks and rollout engines may share GPUs)."""
    if device != "cuda":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        raise RuntimeError(f"policy rank {rank}: platform.device is cuda but this process sees no CUDA device")
    return torch.device("cuda", rank % count)
