"""Refit over a side process group (separate engines): one sender, N receivers.

The side group is built directly from a ``TCPStore`` and a backend process
group object (``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on GPU). It
is never registered with ``torch.distributed``: the default world, its
groups and ``dist.is_initialized()`` are untouched, so a policy world and the
engines' own TP worlds can coexist with it in the same processes.

Rendezvous: the refit driver serves the group's ``TCPStore`` with a
``RendezvousServer`` (bound before its port is handed out) and every member, the
sender included, joins it as a client, so there is no pick-then-bind race.
A member keeps one group for the whole session in a :class:`SideGroupSlot`
(reused by every refit with the same signature) and closes it on shutdown;
the process group holds its store connection until it is closed.

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

import contextlib
import datetime
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from harness.parallel.rendezvous import join_rendezvous
from harness.refit.buckets import calculate_aligned_size, iter_named_tensor_buckets
from harness.refit.packing import (
    TensorInfo,
    info_nbytes,
    pack,
    packed_size,
    unpack_views,
)

LoadFn = Callable[[list[tuple[str, torch.Tensor]]], None]


@dataclass
class SideGroup:
    """A process group private to refit; ``rank`` 0 is conventionally the sender."""

    pg: Any
    store: Any
    rank: int
    world_size: int
    device: torch.device

    @property
    def closed(self) -> bool:
        return self.pg is None

    def _live_pg(self) -> Any:
        if self.pg is None:
            raise RuntimeError(f"side-group rank {self.rank}: the side group is closed")
        return self.pg

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        self._live_pg().broadcast([tensor], opts).wait()

    def all_reduce_min(self, tensor: torch.Tensor) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self._live_pg().allreduce([tensor], opts).wait()

    def close(self) -> None:
        """Shut the backend down and drop the group and its store connection (idempotent).

        The process group keeps its store; both are released here, so the
        member's connection to the served store closes with them."""
        pg, self.pg, self.store = self.pg, None, None
        shutdown = getattr(pg, "shutdown", None)
        if callable(shutdown):
            with contextlib.suppress(RuntimeError):  # a peer already gone: nothing left to release
                shutdown()


def _check_int(field: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"side group {field} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"side group {field} must be in {bound}, got {value}")
    return value


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
    """Join the side group of ``world_size`` members whose store is served at ``host:port``.

    Every member, rank 0 included, joins as a *client*: the store must already
    be served by someone else (the refit driver's
    :class:`harness.parallel.rendezvous.RendezvousServer`, bound before its port was
    handed out), so no member ever binds a port it was told about. Collective
    over all members. ``backend`` is ``gloo`` (CPU tensors) or ``nccl`` (CUDA
    tensors); ``prefix`` namespaces the group's keys in the store (the driver
    makes it unique per session). Bad arguments raise ValueError (TypeError
    for a non-int) naming the field; a store that cannot be reached raises RuntimeError naming the rank
    and the address.
    """
    world_size = _check_int("world_size", world_size, 2)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"side group rank {rank!r} outside [0, {world_size})")
    if not isinstance(host, str) or not host:
        raise ValueError(f"side group host must be a non-empty string, got {host!r}")
    port = _check_int("port", port, 1, 65535)
    if not timeout_s > 0:
        raise ValueError(f"side group timeout_s must be > 0, got {timeout_s!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"side group backend must be 'gloo' or 'nccl', got {backend!r}")
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"side group prefix must be a non-empty string, got {prefix!r}")
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = join_rendezvous(host, port, timeout_s)
    except Exception as exc:
        raise RuntimeError(
            f"side-group rank {rank} of {world_size}: cannot join the refit store at {host}:{port} "
            f"within {timeout_s}s (the refit driver serves it): {exc}"
        ) from exc
    prefixed = dist.PrefixStore(prefix, store)
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size, options)
        device = torch.device("cpu")
    else:
        pg = dist.ProcessGroupNCCL(prefixed, rank, world_size)
        device = torch.device("cuda", torch.cuda.current_device())
    return SideGroup(pg=pg, store=store, rank=rank, world_size=world_size, device=device)


class SideGroupSlot:
    """The one side group a member holds: built by the first refit, reused by every later one.

    ``join(**kw)`` takes :func:`create_side_group`'s arguments. While the
    signature (host, port, rank, world_size, backend, prefix) is unchanged it
    returns the group it holds; a different signature (a new refit session)
    closes the held group first and then joins the new one, so a member never
    holds more than one. ``close()`` releases it (idempotent; a later
    ``join`` builds a new one).
    """

    def __init__(self) -> None:
        self._group: SideGroup | None = None
        self._key: tuple | None = None
        self.created = 0  # groups built over this slot's life (tests: 1 per session)

    def join(self, *, host: str, port: int, rank: int, world_size: int, timeout_s: float = 120.0,
             backend: str = "gloo", prefix: str = "harness-refit") -> SideGroup:
        key = (host, port, rank, world_size, backend, prefix)
        if self._group is not None and self._key == key:
            return self._group
        self.close()
        self._group = create_side_group(host=host, port=port, rank=rank, world_size=world_size,
                                        timeout_s=timeout_s, backend=backend, prefix=prefix)
        self._key = key
        self.created += 1
        return self._group

    def describe(self) -> list[dict[str, Any]]:
        """The held group's signature (``[]`` or one dict): what tests and diagnostics read."""
        if self._group is None or self._key is None:
            return []
        host, port, rank, world_size, backend, prefix = self._key
        return [{"host": host, "port": port, "rank": rank, "world_size": world_size, "backend": backend,
                 "prefix": prefix, "created": self.created}]

    def close(self) -> None:
        group, self._group, self._key = self._group, None, None
        if group is not None:
            group.close()


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
    "SideGroupSlot",
    "broadcast_weights",
    "create_side_group",
    "packed_size",
    "receive_broadcast",
]
