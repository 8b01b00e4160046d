"""Refit over a side process group (separate engines): one sender, N receivers.

The side group is built directly from a ``TCPStore`` and a backend process
group object (``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on GPU). It
is never registered with ``torch.distributed``: the default world, its
groups and ``dist.is_initialized()`` are untouched, so a policy world and the
engines' own TP worlds can coexist with it in the same processes.

Wire format of one refit (all on the side group, from ``src``):

1. a manifest: ``[(name, shape, dtype_str), ...]`` pickled into ``uint8``
   (a length broadcast, then the bytes);
2. an agreement all-reduce (MIN of an ok flag): every receiver compares the
   manifest with its ``state_dict_info``; any mismatch aborts the refit on
   every member with a RuntimeError naming the rejecting rank;
3. one packed ``uint8`` buffer per bucket of ``iter_named_tensor_buckets``
   (both sides derive the same buckets from the manifest), broadcast in order.
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from harness.refit.buckets import calculate_aligned_size, iter_named_tensor_buckets
from harness.refit.packing import TensorInfo, info_nbytes, pack, packed_size, unpack_views

LoadFn = Callable[[list[tuple[str, torch.Tensor]]], None]


@dataclass
class SideGroup:
    """A process group private to refit; ``rank`` 0 is conventionally the sender."""

    pg: Any
    store: Any
    rank: int
    world_size: int
    device: torch.device

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        self.pg.broadcast([tensor], opts).wait()

    def all_reduce_min(self, tensor: torch.Tensor) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self.pg.allreduce([tensor], opts).wait()

    def close(self) -> None:
        shutdown = getattr(self.pg, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except Exception:
                pass
        self.pg = None
        self.store = None


def create_side_group(
    *,
    host: str,
    port: int,
    rank: int,
    world_size: int,
    timeout_s: float = 120.0,
    backend: str = "gloo",
    prefix: str = "harness-refit",
) -> SideGroup:
    """Join (rank 0: host) a side group of ``world_size`` members at ``host:port``.

    Collective over all members. ``backend`` is ``gloo`` (CPU tensors) or
    ``nccl`` (CUDA tensors). Bad arguments raise ValueError naming the field.
    """
    if world_size < 2:
        raise ValueError(f"side group world_size must be >= 2, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"side group rank {rank} outside [0, {world_size})")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout)
    prefixed = dist.PrefixStore(prefix, store)
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size, options)
        device = torch.device("cpu")
    elif backend == "nccl":
        pg = dist.ProcessGroupNCCL(prefixed, rank, world_size)
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        raise ValueError(f"side group backend must be 'gloo' or 'nccl', got {backend!r}")
    return SideGroup(pg=pg, store=store, rank=rank, world_size=world_size, device=device)


def _broadcast_bytes(group: SideGroup, payload: bytes | None, src: int) -> bytes:
    length = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64, device=group.device)
    group.broadcast(length, src)
    buffer = torch.empty(int(length.item()), dtype=torch.uint8, device=group.device)
    if payload is not None:
        buffer.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    group.broadcast(buffer, src)
    return payload if payload is not None else bytes(buffer.cpu().numpy().tobytes())


def _agree(group: SideGroup, ok: bool) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=group.device)
    group.all_reduce_min(flag)
    return bool(flag.item())


def _manifest_problems(
    manifest: list[tuple[str, tuple[int, ...], str]], state_dict_info: Mapping[str, TensorInfo]
) -> list[str]:
    problems = []
    seen: set[str] = set()
    for name, shape, dtype_str in manifest:
        if name in seen:
            problems.append(f"duplicate tensor {name!r}")
        seen.add(name)
        if name not in state_dict_info:
            problems.append(f"unexpected tensor {name!r}")
            continue
        exp_shape, exp_dtype = state_dict_info[name]
        if tuple(exp_shape) != tuple(shape) or str(exp_dtype) != dtype_str:
            problems.append(f"{name!r}: sender {tuple(shape)} {dtype_str}, receiver {tuple(exp_shape)} {exp_dtype}")
    missing = [n for n in state_dict_info if n not in seen]
    if missing:
        problems.append(f"missing tensors {missing}")
    return problems


def broadcast_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    group: SideGroup,
    *,
    buffer_size_bytes: int,
    src: int = 0,
) -> int:
    """Sender side: broadcast every tensor in bucket order; return the bucket count.

    Raises RuntimeError when any receiver rejects the manifest (nothing is
    streamed then; every member raises).
    """
    pairs = [(name, tensor.detach()) for name, tensor in named_tensors]
    manifest = [(name, tuple(t.shape), str(t.dtype)) for name, t in pairs]
    _broadcast_bytes(group, pickle.dumps(manifest), src)
    if not _agree(group, True):
        raise RuntimeError("refit broadcast aborted: a receiver rejected the manifest (see its error)")
    buckets = 0
    for bucket in iter_named_tensor_buckets(pairs, buffer_size_bytes):
        buffer = pack([t.to(group.device) for _, t in bucket])
        group.broadcast(buffer, src)
        buckets += 1
    return buckets


def receive_broadcast(
    group: SideGroup,
    *,
    state_dict_info: Mapping[str, TensorInfo],
    load_fn: LoadFn,
    buffer_size_bytes: int,
    src: int = 0,
) -> list[str]:
    """Receiver side: check the manifest, then load each bucket; return names in order.

    ``load_fn`` receives views into a bucket buffer that is dropped after the
    call. Raises RuntimeError naming this rank and the problems when the
    manifest does not match ``state_dict_info`` (after telling the others).
    """
    manifest = pickle.loads(_broadcast_bytes(group, None, src))
    problems = _manifest_problems(manifest, state_dict_info)
    if not _agree(group, not problems):
        if problems:
            raise RuntimeError(f"refit broadcast rejected by side-group rank {group.rank}: " + "; ".join(problems))
        raise RuntimeError("refit broadcast aborted: another receiver rejected the manifest")
    info = {name: (tuple(shape), state_dict_info[name][1]) for name, shape, _ in manifest}

    class _Sized:  # bucket planning needs only numel/element_size
        def __init__(self, nbytes: int):
            self.nbytes = nbytes

        def numel(self) -> int:
            return self.nbytes

        def element_size(self) -> int:
            return 1

    plan = [(name, _Sized(info_nbytes(info[name]))) for name, _, _ in manifest]
    loaded: list[str] = []
    for bucket in iter_named_tensor_buckets(plan, buffer_size_bytes):
        names = [name for name, _ in bucket]
        size = sum(calculate_aligned_size(s.nbytes) for _, s in bucket)
        buffer = torch.empty(size, dtype=torch.uint8, device=group.device)
        group.broadcast(buffer, src)
        load_fn(unpack_views(buffer, names, info, size))
        loaded.extend(names)
    return loaded


__all__ = [
    "SideGroup",
    "create_side_group",
    "broadcast_weights",
    "receive_broadcast",
    "packed_size",
]
