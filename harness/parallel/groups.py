"""Rank layout (Megatron mixed-radix rule) and torch.distributed group creation.

Two grids share the world (Megatron "MoE parallel folding", order tp-cp-ep-dp-pp,
first token fastest):

    dense : rank = tp + TP*(cp + CP*(dp + DP*pp))
    expert: rank = etp + ETP*(ep + EP*(edp + EDP*pp))     EDP = TP*CP*DP / (ETP*EP)

A group of kind "a_b" is the set of ranks that differ only in coordinates a and
b (for example `dp_cp`). `layout_from_spec` computes this locally; when the
topology planner (`harness.spec.topology.plan`) is present its group lists are
used instead (`layout_from_topology`), and the two must agree.

`ProcessGroups.create(layout, rank)` calls `dist.new_group(ranks, group_desc=kind)`
for *every* group of every kind, in the same order on all ranks (new_group is a
collective over the world), and keeps the ones containing `rank`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.registry.policy import policy_backend
from harness.spec.typed import ModelSpec, PolicySpec

DENSE_AXES = ("tp", "cp", "dp", "pp")
EXPERT_AXES = ("etp", "ep", "edp", "pp")
# Group kinds the policy needs; each is a tuple of axes of one grid.
GROUP_KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tp": ("dense", ("tp",)),
    "cp": ("dense", ("cp",)),
    "dp": ("dense", ("dp",)),
    "dp_cp": ("dense", ("cp", "dp")),
    "tp_cp": ("dense", ("tp", "cp")),
    "pp": ("dense", ("pp",)),
    "ep": ("expert", ("ep",)),
    "etp": ("expert", ("etp",)),
    "edp": ("expert", ("edp",)),
    "tp_ep": ("expert", ("etp", "ep")),
}


@dataclass(frozen=True)
class RankLayout:
    """Sizes, per-rank coordinates and the groups of every kind."""

    sizes: dict[str, int]
    coords: list[dict[str, int]]  # index = global rank
    groups: dict[str, list[list[int]]] = field(default_factory=dict)

    @property
    def world(self) -> int:
        return len(self.coords)

    def group_of(self, kind: str, rank: int) -> list[int]:
        for ranks in self.groups[kind]:
            if rank in ranks:
                return ranks
        raise KeyError(f"rank {rank} is in no {kind} group")


def validate_policy_layout(policy: PolicySpec, model: ModelSpec) -> None:
    """Raise `ValueError` naming the spec field when the policy layout cannot
    shard `model` (the typed spec blocks). Checked before any worker starts."""
    tp, pp, cp, ep, etp, dp = policy.tp, policy.pp, policy.cp, policy.ep, policy.etp, policy.dp
    for name, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep), ("etp", etp), ("dp", dp)):
        if v < 1:
            raise ValueError(f"policy.{name} must be >= 1, got {v}")
    if etp != 1:
        raise ValueError(f"policy.etp={etp}: only expert tensor parallel size 1 is implemented")
    if (tp * cp * dp) % (etp * ep):
        raise ValueError(f"policy.ep={ep}: etp*ep must divide tp*cp*dp={tp * cp * dp}")
    if model.experts % ep:
        raise ValueError(f"policy.ep={ep} must divide model.experts={model.experts}")
    if model.heads % tp:
        raise ValueError(f"policy.tp={tp} must divide model.heads={model.heads}")
    if model.kv_heads % tp:
        raise ValueError(f"policy.tp={tp} must divide model.kv_heads={model.kv_heads} (no KV replication)")
    if model.vocab % tp:
        raise ValueError(f"policy.tp={tp} must divide model.vocab={model.vocab}")
    no_sp_backend = "sp" in policy_backend(policy.backend).fixed  # dtensor: no SP
    if tp > 1 and not policy.sp and not no_sp_backend:
        raise ValueError("policy.sp must be true when policy.tp > 1 (MoE training needs sequence parallel)")
    seq = policy.seq_len
    if seq % (2 * cp * tp) if cp > 1 else seq % tp:
        raise ValueError(f"policy.seq_len={seq} must be divisible by {2 * cp * tp if cp > 1 else tp} (2*cp*tp)")
    stage_layers(model.layers, pp, policy.pp_layout)


def stage_layers(layers: int, pp: int, pp_layout: list[int] | None) -> list[range]:
    """Layer ranges per pipeline stage. `pp_layout=[first, last]` fixes the first
    and last stage sizes; the rest are split evenly. Raises naming policy.pp_layout."""
    if pp_layout is None:
        if layers % pp:
            raise ValueError(f"policy.pp={pp} must divide model.layers={layers} (or set policy.pp_layout)")
        counts = [layers // pp] * pp
    else:
        if pp < 2 or len(pp_layout) != 2:
            raise ValueError("policy.pp_layout must be [first_stage_layers, last_stage_layers] with pp >= 2")
        first, last = (int(x) for x in pp_layout)
        middle = layers - first - last
        if first < 1 or last < 1 or middle < 0 or (pp > 2 and middle % (pp - 2)) or (pp == 2 and middle):
            raise ValueError(f"policy.pp_layout={pp_layout} does not split model.layers={layers} over pp={pp}")
        counts = [first] + [middle // (pp - 2)] * (pp - 2) + [last] if pp > 2 else [first, last]
    starts = list(itertools.accumulate([0] + counts))
    return [range(starts[i], starts[i + 1]) for i in range(pp)]


def layout_from_spec(policy: PolicySpec) -> RankLayout:
    """Compute coordinates and groups with the mixed-radix rule (``policy``: the typed block)."""
    tp, pp, cp, ep, etp, dp = policy.tp, policy.pp, policy.cp, policy.ep, policy.etp, policy.dp
    edp = tp * cp * dp // (etp * ep)
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep, "etp": etp, "edp": edp}
    world = tp * cp * dp * pp
    coords = []
    for r in range(world):
        t, rest = r % tp, r // tp
        c, rest = rest % cp, rest // cp
        d, p = rest % dp, rest // dp
        e_t, rest = r % etp, r // etp
        e_p, rest = rest % ep, rest // ep
        e_d = rest % edp
        coords.append({"tp": t, "cp": c, "dp": d, "pp": p, "etp": e_t, "ep": e_p, "edp": e_d})
    groups: dict[str, list[list[int]]] = {}
    for kind, (grid, axes) in GROUP_KINDS.items():
        all_axes = DENSE_AXES if grid == "dense" else EXPERT_AXES
        fixed = [a for a in all_axes if a not in axes]
        buckets: dict[tuple[int, ...], list[int]] = {}
        for r, c in enumerate(coords):
            buckets.setdefault(tuple(c[a] for a in fixed), []).append(r)
        groups[kind] = sorted(buckets.values())
    return RankLayout(sizes=sizes, coords=coords, groups=groups)


def layout_from_topology(topology: Any, policy: PolicySpec) -> RankLayout:
    """Use the planner's groups where it provides a kind; fall back to the
    local rule for kinds it lacks. Raises if a provided kind disagrees."""
    local = layout_from_spec(policy)
    planned = _planner_groups(topology)
    groups = dict(local.groups)
    for kind, lists in planned.items():
        if kind in groups:
            norm = sorted(sorted(int(r) for r in g) for g in lists)
            if norm != groups[kind]:
                raise ValueError(
                    f"topology group kind {kind!r} disagrees with the mixed-radix rule: {norm} vs {groups[kind]}"
                )
    return RankLayout(sizes=local.sizes, coords=local.coords, groups=groups)


def _planner_groups(topology: Any) -> dict[str, list[list[int]]]:
    """Extract `{kind: [[ranks]]}` for the policy role from A's Topology, whatever
    its exact shape (object attribute or dict). Unknown shapes give {}."""
    if topology is None:
        return {}
    groups = getattr(topology, "groups", None)
    if groups is None and isinstance(topology, Mapping):
        groups = topology.get("groups")
    if isinstance(groups, Mapping) and "policy" in groups and isinstance(groups["policy"], Mapping):
        groups = groups["policy"]
    if not isinstance(groups, Mapping):
        return {}
    out = {}
    for kind, lists in groups.items():
        if isinstance(lists, (list, tuple)) and all(isinstance(g, (list, tuple)) for g in lists):
            out[str(kind)] = [list(g) for g in lists]
    return out


class ProcessGroups:
    """The torch.distributed groups this rank belongs to, by kind."""

    def __init__(self, layout: RankLayout, rank: int, by_kind: dict[str, Any]) -> None:
        self.layout = layout
        self.rank = rank
        self.coords = layout.coords[rank]
        self._by_kind = by_kind

    @classmethod
    def create(cls, layout: RankLayout, rank: int) -> ProcessGroups:
        import torch.distributed as dist

        mine: dict[str, Any] = {}
        for kind in GROUP_KINDS:  # identical iteration order on every rank
            if all(len(g) == 1 for g in layout.groups[kind]):
                mine[kind] = None  # trivial kind: collectives on it are identities
                continue
            for ranks in layout.groups[kind]:
                g = dist.new_group(ranks, group_desc=kind)
                if rank in ranks:
                    mine[kind] = g
        return cls(layout, rank, mine)

    def __getitem__(self, kind: str):
        """The group handle, or None when every group of this kind has one rank."""
        return self._by_kind[kind]

    def ranks(self, kind: str) -> list[int]:
        return self.layout.group_of(kind, self.rank)

    def size(self, kind: str) -> int:
        return len(self.ranks(kind))
