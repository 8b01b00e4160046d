"""The default process group of a policy world, the same for every policy backend."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from harness import code_identity
from harness.devices import local_device
from harness.parallel import settle
from harness.parallel.rendezvous import join_rendezvous
from harness.portable import enter_process


def init_distributed(rank: int, world_size: int, master_addr: str, master_port: int, device: str = "cpu") -> None:
    """Per-process determinism + the default process group (gloo on CPU, nccl on cuda).

    Every rank joins the rendezvous store served by the process that started
    the ranks at ``master_addr:master_port`` (harness.parallel.rendezvous: the
    port is bound before it is handed out). Collectives time out after ``HARNESS_COLLECTIVE_TIMEOUT_S`` (default 300 s),
    so a desynchronised rank becomes an error naming the worker instead of a
    hang (the backends' own default is 30 minutes)."""
    torch.set_num_threads(1)
    if device == "cuda":
        # cuBLAS needs a fixed workspace for deterministic results (set before its first use)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.cuda.set_device(local_device(rank, device))
    torch.use_deterministic_algorithms(True)
    code_identity.check_process(f"policy rank {rank}")  # the driver's harness, file for file
    enter_process(device)  # a pinned CPU run's portable kernels (harness.portable)
    settle.install()  # autograd's in-place choices must not depend on gloo's thread timing
    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        # run option collective_timeout_s, carried here by the runner (harness.spec.runplan); "": the default
        timeout = datetime.timedelta(seconds=float(os.environ.get("HARNESS_COLLECTIVE_TIMEOUT_S") or "300"))
        store = join_rendezvous(master_addr, master_port, timeout.total_seconds())
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
