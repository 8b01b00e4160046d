"""The colocated gather topology: one gloo subgroup per rollout engine's GPU-rank range.

With colocated placement, rollout engine ``i`` occupies trainer ranks
``[offsets[i], offsets[i] + counts[i])`` (the GPUs it shares with them;
offsets default to the cumulative sum of the counts). A colocated refit
gathers every rank's weight payload to the engine's first rank (the *gather
source*) over a subgroup of exactly those ranks, and only the source talks to
the engine. Ranks outside every range are *placeholders*: they hold no group
and take no part in a colocated refit.

:func:`plan_colocate_topology` is the pure half (validation, ranges, who
routes where) and :func:`connect_colocate_topology` the collective half, which
keeps its state in a :class:`ColocateTopology`:

* the layout signature ``(world_size, counts, offsets)`` is cached: a connect
  with the same layout is a no-op (no collective, the same group objects);
* a changed layout (a recovered engine that resized the topology) destroys
  every subgroup this rank holds and builds the new layout's subgroups.

Every rank of the default world must enter :func:`connect_colocate_topology`
with the same layout (``dist.new_group`` is collective over the world), also
placeholders, and also on a no-op reconnect (which then costs nothing).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.refit.engine_offsets import derive_engine_gpu_offsets

LayoutKey = tuple[int, tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class ColocatePlan:
    """A validated layout: engine ``i`` covers ``range(offsets[i], offsets[i] + counts[i])``."""

    world_size: int
    counts: tuple[int, ...]
    offsets: tuple[int, ...]

    @property
    def key(self) -> LayoutKey:
        """The layout signature a connect caches."""
        return (self.world_size, self.counts, self.offsets)

    def ranks_of(self, engine_index: int) -> list[int]:
        start = self.offsets[engine_index]
        return list(range(start, start + self.counts[engine_index]))

    def engine_of(self, rank: int) -> int | None:
        """The index of the engine whose range covers ``rank``; None for a placeholder."""
        for i, (start, count) in enumerate(zip(self.offsets, self.counts)):
            if start <= rank < start + count:
                return i
        return None

    def placeholders(self) -> list[int]:
        return [r for r in range(self.world_size) if self.engine_of(r) is None]


def plan_colocate_topology(
    world_size: int, engine_gpu_counts: Sequence[int], engine_gpu_offsets: Sequence[int] | None = None
) -> ColocatePlan:
    """Validate a layout; ValueError names the field and index of the first problem.

    Counts must be positive ints; offsets (default: cumulative sums of the
    counts) non-negative, one per engine; every range must lie inside
    ``[0, world_size)`` and ranges must not overlap (gaps are placeholder ranks).
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    counts = tuple(engine_gpu_counts)
    for i, c in enumerate(counts):
        if not isinstance(c, int) or isinstance(c, bool) or c < 1:
            raise ValueError(f"engine_gpu_counts[{i}] must be a positive int, got {c!r}")
    offsets = tuple(derive_engine_gpu_offsets(counts) if engine_gpu_offsets is None else engine_gpu_offsets)
    if len(offsets) != len(counts):
        raise ValueError(f"engine_gpu_offsets has {len(offsets)} entries for {len(counts)} engine(s)")
    for i, o in enumerate(offsets):
        if not isinstance(o, int) or isinstance(o, bool) or o < 0:
            raise ValueError(f"engine_gpu_offsets[{i}] must be a non-negative int, got {o!r}")
        if o + counts[i] > world_size:
            raise ValueError(f"engine {i} covers ranks [{o}, {o + counts[i]}), outside a world of {world_size}")
    by_start = sorted(range(len(counts)), key=lambda i: offsets[i])
    for a, b in itertools.pairwise(by_start):
        if offsets[a] + counts[a] > offsets[b]:
            raise ValueError(f"engines {a} and {b} overlap: ranks [{offsets[a]}, {offsets[a] + counts[a]}) "
                             f"and [{offsets[b]}, {offsets[b] + counts[b]})")
    return ColocatePlan(world_size=world_size, counts=counts, offsets=offsets)


@dataclass
class ColocateTopology:
    """One trainer rank's routing state for colocated refit (what a connect leaves behind).

    ``group``: the subgroup of the engine covering this rank (None on a
    placeholder); ``groups``: every live subgroup this rank holds (what a
    rebuild destroys); ``src``: the global rank of the gather source (the
    covering engine's first rank) or None; ``engine_index``: index into the
    caller's engine list or None (the caller resolves the engine at call time,
    so an engine swapped after a recovery is picked up); ``layout_key``: the
    cached signature; ``builds``: how many times subgroups were (re)built.
    """

    rank: int = -1
    group: Any = None
    groups: list[Any] = field(default_factory=list)
    src: int | None = None
    engine_index: int | None = None
    layout_key: LayoutKey | None = None
    builds: int = 0

    @property
    def is_source(self) -> bool:
        return self.src is not None and self.src == self.rank


def _default_new_group(ranks: list[int]) -> Any:
    import torch.distributed as dist

    return dist.new_group(ranks=ranks, backend="gloo")


def _default_destroy(group: Any) -> None:
    import torch.distributed as dist

    dist.destroy_process_group(group)


def connect_colocate_topology(
    topology: ColocateTopology,
    engine_gpu_counts: Sequence[int],
    engine_gpu_offsets: Sequence[int] | None = None,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    new_group: Callable[[list[int]], Any] = _default_new_group,
    destroy: Callable[[Any], None] = _default_destroy,
) -> bool:
    """Bring ``topology`` to the given layout; True when subgroups were (re)built.

    Collective over the default world unless the layout equals the cached one
    (then it returns False without any collective). ``rank``/``world_size``
    default to the default world's. ``new_group(ranks)`` must be called by every
    rank for every engine in engine order (the default is ``dist.new_group``
    with gloo); it returns a group object, of which this rank keeps only the
    one it belongs to.
    """
    if rank is None or world_size is None:
        import torch.distributed as dist

        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    plan = plan_colocate_topology(world_size, engine_gpu_counts, engine_gpu_offsets)
    if topology.layout_key == plan.key and topology.rank == rank:
        return False
    for group in topology.groups:
        destroy(group)
    topology.groups, topology.group, topology.src, topology.engine_index = [], None, None, None
    topology.layout_key = None
    mine = plan.engine_of(rank)
    for i in range(len(plan.counts)):
        group = new_group(plan.ranks_of(i))
        if i == mine:
            topology.group = group
            topology.groups.append(group)
    topology.rank = rank
    topology.engine_index = mine
    topology.src = None if mine is None else plan.offsets[mine]
    topology.layout_key = plan.key
    topology.builds += 1
    return True


def disconnect_colocate_topology(
    topology: ColocateTopology, *, destroy: Callable[[Any], None] = _default_destroy
) -> None:
    """Destroy every subgroup ``topology`` holds and forget the layout (idempotent, local)."""
    for group in topology.groups:
        destroy(group)
    topology.groups, topology.group, topology.src, topology.engine_index = [], None, None, None
    topology.layout_key = None
