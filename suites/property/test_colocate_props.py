"""Hypothesis properties of the colocated gather topology (harness.refit.colocate).

The layout logic is run for every rank of a simulated world: ``new_group`` and
``destroy`` are recorders (a group is the tuple of its ranks plus a build
serial), so the properties see exactly which subgroups each rank created,
kept and destroyed. The real gloo groups are exercised in
suites/integration/test_sglang_refit.py.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.refit.colocate import (
    ColocateTopology,
    connect_colocate_topology,
    disconnect_colocate_topology,
    plan_colocate_topology,
)

MORE = settings(max_examples=max(200, settings().max_examples))


@st.composite
def layouts(draw, max_world: int = 12):
    """(world_size, counts, offsets or None): dense (default offsets) or with placeholder gaps."""
    world = draw(st.integers(1, max_world))
    counts: list[int] = []
    offsets: list[int] = []
    cursor = 0
    dense = draw(st.booleans())
    while cursor < world and (not counts or draw(st.booleans())):
        gap = 0 if dense else draw(st.integers(0, world - cursor - 1))
        start = cursor + gap
        count = draw(st.integers(1, world - start))
        offsets.append(start)
        counts.append(count)
        cursor = start + count
    order = draw(st.permutations(range(len(counts)))) if not dense else list(range(len(counts)))
    counts = [counts[i] for i in order]
    offsets = [offsets[i] for i in order]
    return world, counts, (None if dense else offsets)


class World:
    """Every rank's topology plus the calls each rank made."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.tops = [ColocateTopology() for _ in range(world)]
        self.serial = itertools.count()
        self.created: list[list[tuple]] = [[] for _ in range(world)]
        self.destroyed: list[list[tuple]] = [[] for _ in range(world)]

    def connect(self, counts, offsets) -> list[bool]:
        calls = next(self.serial)
        out = []
        for r in range(self.world):
            def new_group(ranks, r=r):
                g = (calls, tuple(ranks))
                self.created[r].append(g)
                return g

            out.append(connect_colocate_topology(
                self.tops[r], counts, offsets, rank=r, world_size=self.world,
                new_group=new_group, destroy=self.destroyed[r].append))
        return out


def _check_layout(w: World, counts, offsets) -> None:
    plan = plan_colocate_topology(w.world, counts, offsets)
    covered: dict[int, int] = {}
    for i in range(len(counts)):
        for r in plan.ranks_of(i):
            assert r not in covered, f"rank {r} in engines {covered[r]} and {i}"
            covered[r] = i
    for r, top in enumerate(w.tops):
        if r in covered:
            i = covered[r]
            assert top.engine_index == i and top.group is not None
            assert top.group[1] == tuple(plan.ranks_of(i)) and r in top.group[1]
            assert top.groups == [top.group]  # exactly one group held
            assert top.src == plan.offsets[i] == min(top.group[1])
            assert top.is_source == (r == plan.offsets[i])
        else:
            assert (top.group, top.groups, top.src, top.engine_index) == (None, [], None, None)
    assert sorted(plan.placeholders()) == sorted(set(range(w.world)) - set(covered))


@MORE
@given(layouts())
def test_every_engine_rank_is_in_exactly_one_group_and_placeholders_in_none(layout):
    world, counts, offsets = layout
    w = World(world)
    assert all(w.connect(counts, offsets))
    _check_layout(w, counts, offsets)
    # every rank issued the same new_group calls, in engine order (the collective contract)
    assert len({tuple(c) for c in w.created}) == 1 and len(w.created[0]) == len(counts)


@MORE
@given(layouts())
def test_a_reconnect_with_the_same_layout_is_a_no_op(layout):
    world, counts, offsets = layout
    w = World(world)
    w.connect(counts, offsets)
    before = [(t.group, list(t.groups), t.builds) for t in w.tops]
    created = [len(c) for c in w.created]
    dense_offsets = offsets if offsets is not None else plan_colocate_topology(world, counts).offsets
    for again in (offsets, list(dense_offsets)):  # explicit offsets equal to the defaults: same layout
        assert w.connect(list(counts), again) == [False] * world
    assert [(t.group, list(t.groups), t.builds) for t in w.tops] == before
    assert [len(c) for c in w.created] == created and not any(w.destroyed)


@MORE
@given(layouts(), layouts())
def test_a_changed_layout_destroys_every_held_group_and_rebuilds(first, second):
    world, counts, offsets = first
    _, counts2, offsets2 = second
    try:
        plan_colocate_topology(world, counts2, offsets2)
    except ValueError:
        counts2, offsets2 = [world], None  # the second layout must fit the first world
    same = plan_colocate_topology(world, counts, offsets).key == plan_colocate_topology(
        world, counts2, offsets2).key
    w = World(world)
    w.connect(counts, offsets)
    held = [list(t.groups) for t in w.tops]
    rebuilt = w.connect(counts2, offsets2)
    if same:
        assert rebuilt == [False] * world and not any(w.destroyed)
        return
    assert rebuilt == [True] * world
    assert w.destroyed == held  # every group held before, and nothing else
    assert all(t.builds == 2 for t in w.tops)
    _check_layout(w, counts2, offsets2)
    for t in w.tops:  # the new groups are new objects
        assert all(g not in h for g in t.groups for h in held)


@given(layouts())
def test_disconnect_destroys_what_is_held_and_a_later_connect_rebuilds(layout):
    world, counts, offsets = layout
    w = World(world)
    w.connect(counts, offsets)
    held = [list(t.groups) for t in w.tops]
    for r, t in enumerate(w.tops):
        disconnect_colocate_topology(t, destroy=w.destroyed[r].append)
        disconnect_colocate_topology(t, destroy=w.destroyed[r].append)  # idempotent
    assert w.destroyed == held
    assert w.connect(counts, offsets) == [True] * world
    _check_layout(w, counts, offsets)


@pytest.mark.parametrize("counts,offsets,match", [
    ([0], None, r"engine_gpu_counts\[0\]"),
    ([2, True], None, r"engine_gpu_counts\[1\]"),
    ([2, 2], [0], "engine_gpu_offsets has 1"),
    ([2], [-1], r"engine_gpu_offsets\[0\]"),
    ([3, 2], None, "engine 1 covers ranks \\[3, 5\\), outside a world of 4"),
    ([2, 2], [0, 1], "engines 0 and 1 overlap"),
])
def test_bad_layouts_are_refused_naming_the_field(counts, offsets, match):
    with pytest.raises(ValueError, match=match):
        plan_colocate_topology(4, counts, offsets)
