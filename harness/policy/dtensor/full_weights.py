"""Rank 0's full weights of a DTensor model from one gather (the refit export).

``DTensor.full_tensor()`` per parameter is one or two collectives each (FSDP2's all-gather
over dp, then tp's); the 8-rank dtensor golden's 135 parameters took about 0.85 s a refit
on the 2-core box, each collective waiting on eight processes sharing two cores.
:class:`FlatGather` pays that once, to learn where every element of every full tensor
lives, and afterwards gathers every rank's local shards with one ``gather`` to rank 0 and
rebuilds each full tensor there with one ``index_select``: copies only, so bit for bit the
tensors ``full_tensor()`` returns (``suites/integration/test_dtensor_backend.py`` compares
them after training steps, with and without LoRA).

The map: each rank tags its local elements with their position in the gather buffer
(rank ``r``'s shards, concatenated in parameter order, start at ``r * L``; ``L`` is the
longest rank's total), as float64 (exact below 2**53), wraps the tags in a DTensor of the
parameter's own mesh, placements, shape and stride, and calls ``full_tensor()`` on it:
DTensor's own redistribution (``Shard``, FSDP2's ``_StridedShard``, ``Replicate``, uneven
chunks) puts every tag where its value goes, so no placement rule is re-implemented here.
Parameters of one global layout (mesh, placements, shape, contiguous stride: every layer's
copy of a weight) are tagged as one stack, a DTensor with a new leading dim and each shard
dim one further, so one ``full_tensor()`` maps them all (the 8-rank golden's 135 parameters
in 9 redistributions instead of 135, with LoRA 14 instead of 167); a redistribution moves
each slice of the stack as it would move that tensor alone. Made once per engine, on the
first export. Local shards of more than one dtype, or not on the CPU (gloo's ``gather``),
are :class:`Unsupported` (raised before any collective, alike on every rank: the caller
keeps ``full_tensor()``); a parameter whose mesh, placements, shape, stride or local size
changed after the map was made is an error (:class:`LayoutChanged`), never a silently
wrong tensor.

Collective over the default group: every rank calls :meth:`FlatGather.full` for the same
parameters; only rank 0 gets tensors (``{}`` elsewhere).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Replicate, Shard, _StridedShard

TAG_DTYPE = torch.float64  # integers are exact below 2**53


class Unsupported(ValueError):
    """Parameters this export does not take (the caller gathers them one by one)."""


class LayoutChanged(RuntimeError):
    """A parameter no longer has the layout the map was made for."""


def _alike(shards: list[DTensor]) -> list[list[int]]:
    """The parameters' indices grouped by global layout (mesh, placements, shape, stride), in order
    of first appearance; the same groups on every rank (nothing rank-local decides them), and
    within a group every rank's local shards have one shape. Only a contiguous global layout
    groups (a stack of them is one contiguous tensor); any other parameter stands alone."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(shards):
        contiguous = tuple(p.stride()) == tuple(torch.empty(tuple(p.shape), device="meta").stride())
        key = (p.device_mesh, tuple(p.placements), tuple(p.shape), tuple(p.stride())) if contiguous else ("alone", i)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _stacked_placements(p: DTensor) -> tuple | None:
    """``p``'s placements for a stack of such tensors (a new leading dim): each shard dim one
    further; None for a placement this does not shift (then each parameter gathers alone)."""
    out = []
    for placement in p.placements:
        if isinstance(placement, _StridedShard):
            out.append(_StridedShard(placement.dim % p.ndim + 1, split_factor=placement.split_factor))
        elif isinstance(placement, Shard):
            out.append(Shard(placement.dim % p.ndim + 1))
        elif isinstance(placement, Replicate):
            out.append(placement)
        else:
            return None
    return tuple(out)


def _layout(p: DTensor) -> tuple:
    return (p.device_mesh, tuple(p.placements), tuple(p.shape), tuple(p.stride()), p._local_tensor.numel(),
            p._local_tensor.dtype)


class FlatGather:
    """The element map of ``params`` (DTensors and plain tensors) and the one-gather export."""

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.names = [n for n, p in params.items() if isinstance(p, DTensor)]
        self.plain = [n for n, p in params.items() if not isinstance(p, DTensor)]
        shards = [params[n].detach() for n in self.names]
        self.layouts = [_layout(p) for p in shards]
        dtypes = {layout[-1] for layout in self.layouts}
        if len(dtypes) > 1:
            raise Unsupported(f"local shards of several dtypes {sorted(map(str, dtypes))}")
        devices = {p._local_tensor.device.type for p in shards}
        if devices - {"cpu"}:
            raise Unsupported(f"local shards on {sorted(devices)} (the one-gather export is CPU only)")
        self.dtype = next(iter(dtypes), torch.float32)
        local = torch.tensor([layout[4] for layout in self.layouts], dtype=torch.int64)
        every = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(every, local)
        self.length = max(int(n.sum()) for n in every)  # L: the longest rank's shards
        mine = torch.cumsum(local, 0) - local  # where each shard starts within this rank's part
        self.index: dict[str, torch.Tensor] = {}

        def tags_of(i: int) -> torch.Tensor:
            """Parameter ``i``'s local elements tagged with their place in the gather buffer."""
            start = self.rank * self.length + int(mine[i])
            return torch.arange(start, start + int(local[i]), dtype=TAG_DTYPE).view(shards[i]._local_tensor.shape)

        for members in _alike(shards):
            first = shards[members[0]]
            tags = [tags_of(i) for i in members]
            stacked = _stacked_placements(first) if len(members) > 1 else None
            if stacked is None:  # one parameter (or placements this does not stack): its own full_tensor()
                fulls = [DTensor.from_local(t, shards[i].device_mesh, shards[i].placements, run_check=False,
                                            shape=shards[i].shape, stride=shards[i].stride()).full_tensor()
                         for i, t in zip(members, tags)]
            else:
                shape = (len(members), *first.shape)
                tagged = DTensor.from_local(torch.stack(tags), first.device_mesh, stacked, run_check=False,
                                            shape=shape, stride=torch.empty(shape, device="meta").stride())
                fulls = list(tagged.full_tensor().unbind(0))
            if self.rank == 0:
                for i, full in zip(members, fulls):
                    self.index[self.names[i]] = full.reshape(-1).to(torch.int64)

    def full(self, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every parameter's full tensor on rank 0 (CPU, a new tensor each), ``{}`` elsewhere."""
        shards = [params[n].detach() for n in self.names]
        for name, p, layout in zip(self.names, shards, self.layouts):
            if _layout(p) != layout:
                raise LayoutChanged(f"parameter {name} changed its layout since the map was made")
        flat = torch.cat([p._local_tensor.reshape(-1) for p in shards]) if shards else torch.empty(0, dtype=self.dtype)
        flat = torch.cat([flat, flat.new_zeros(self.length - flat.numel())])
        parts = [torch.empty_like(flat) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(flat, parts, dst=0)
        if self.rank != 0:
            return {}
        buffer = torch.cat(parts)
        out = {n: buffer.index_select(0, self.index[n]).view(tuple(params[n].shape)) for n in self.names}
        out.update({n: params[n].detach().clone() for n in self.plain})
        return out
