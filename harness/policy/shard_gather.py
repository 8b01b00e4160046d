"""Rank ``dst``'s copy of every rank's list of tagged CPU tensors, in one tensor gather.

A refit's host path collects each rank's owned shards on policy rank 0 as a list of
tuples ``(tag..., tensor)`` per rank. ``dist.gather_object`` of those lists pickles
every tensor (torch's pickler writes each storage through ``torch.save``) and rank 0
unpickles them one by one: on the 2-core box that was most of a refit of the 2-rank
multi-turn workload (rank 0 spent more time in ``_tensor_to_object`` than in its
forward passes). :func:`gather_tagged` sends only the tags and shapes through
``all_gather_object`` (small, plain Python) and the elements of every tensor of one rank
concatenated into one buffer through one ``dist.gather``; rank ``dst`` cuts the buffers
back into tensors of the same shapes and dtype. Copies only: each tensor rank ``dst``
gets is bit for bit the one the other rank held, the result has the structure
``gather_object`` gives (``[rank][i] == (tag..., tensor)``), and every tensor owns its
storage (a view into the buffer would carry the whole buffer into a checkpoint).

Collective over ``group`` (default: the world): every rank calls it. Tensors of more than
one dtype, or not on the CPU, on any rank, are gathered with ``gather_object`` instead;
every rank sees every rank's dtypes and devices, so all take the same path.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist


def gather_tagged(mine: list[tuple], dst: int = 0, group: Any = None) -> list[list[tuple]] | None:
    """Every rank's ``mine`` (tuples whose last element is a tensor) on rank ``dst`` (a rank
    of the world), ``None`` elsewhere."""
    heads = [(tuple(item[:-1]), tuple(item[-1].shape), item[-1].dtype, item[-1].device.type) for item in mine]
    world = dist.get_world_size(group)
    every: list[Any] = [None] * world
    dist.all_gather_object(every, heads, group=group)
    kinds = {(dtype, device) for rank_heads in every for _, _, dtype, device in rank_heads}
    if len(kinds) > 1 or any(device != "cpu" for _, device in kinds):
        gathered: list[Any] | None = [None] * world if dist.get_rank() == dst else None
        dist.gather_object(mine, gathered, dst=dst, group=group)
        return gathered
    dtype = next(iter(kinds))[0] if kinds else torch.float32
    sizes = [sum(math.prod(shape) for _, shape, _, _ in rank_heads) for rank_heads in every]
    length = max(sizes, default=0)
    flat = torch.zeros(length, dtype=dtype)
    offset = 0
    for item in mine:
        n = item[-1].numel()
        flat[offset:offset + n] = item[-1].reshape(-1)
        offset += n
    parts = [torch.empty(length, dtype=dtype) for _ in range(world)] if dist.get_rank() == dst else None
    dist.gather(flat, parts, dst=dst, group=group)
    if parts is None:
        return None
    out: list[list[tuple]] = []
    for rank_heads, buffer in zip(every, parts):
        items, offset = [], 0
        for tags, shape, _, _ in rank_heads:
            n = math.prod(shape)
            items.append((*tags, buffer[offset:offset + n].view(shape).clone()))
            offset += n
        out.append(items)
    return out
