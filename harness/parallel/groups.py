"""Rank layout (Megatron mixed-radix rule) and torch.distributed group creation.

Two grids share the world (Megatron "MoE parallel folding", order tp-cp-ep-dp-pp,
first token fastest):

    dense : rank = tp + TP*(cp + CP*(dp + DP*pp))
    expert: rank = etp + ETP*(ep + EP*(edp + EDP*pp))     EDP = TP*CP*DP / (ETP*EP)

A group of kind "a_b" is the set of ranks that differ only in coordinates a and
b (for example `dp_cp`). The rule is computed once, by the topology planner
(`harness.spec.topology`): `layout_from_topology` reads the run's plan, `layout_from_spec`
the planner's grid of a policy block alone (a world built without a run's plan).

`ProcessGroups.create(layout, rank)` calls `dist.new_group(ranks, group_desc=kind)`
for *every* group of every kind, in the same order on all ranks (new_group is a
collective over the world), and keeps the ones containing `rank`.
"""

from __future__ import annotations

import itertools
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


COORD_ORDER = ("tp", "cp", "dp", "pp", "etp", "ep", "edp")  # a rank's coords, in this order


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
    """The policy ranks' layout of a policy block alone (a world built without a run's plan:
    tests, ``suites/local_world.py``): the planner's own grid (``harness.spec.topology.policy_grid``),
    not a second derivation of the mixed-radix rule."""
    from harness.spec.topology import policy_grid

    return _from_role(policy_grid(_sizes(policy)))


def _sizes(policy: PolicySpec) -> dict[str, int]:
    return {k: int(getattr(policy, k)) for k in ("tp", "cp", "dp", "pp", "ep", "etp")}


def layout_from_topology(topology: Any, policy: PolicySpec) -> RankLayout:
    """The policy role of the run's plan (``topology``: ``harness.spec.topology.Topology``, or
    its ``to_dict()``), which every rank receives as a value. Raises ``ValueError`` when its
    sizes are not ``policy``'s (a plan of another spec)."""
    role = topology.policy if hasattr(topology, "policy") else topology["policy"]
    layout = _from_role(role)
    want = _sizes(policy)
    have = {k: layout.sizes[k] for k in want}
    if have != want:
        raise ValueError(f"the plan's policy sizes {have} are not the spec's {want}")
    return layout


def _from_role(role: Any) -> RankLayout:
    """A :class:`RankLayout` of the planner's policy ``RoleLayout`` (or its ``to_dict()``):
    every group kind this module creates, each kind's groups sorted (the order
    :meth:`ProcessGroups.create` calls ``new_group`` in on every rank)."""
    as_dict = role.to_dict() if hasattr(role, "to_dict") else role
    coords = [{k: int(r["coords"][k]) for k in COORD_ORDER} for r in as_dict["ranks"]]
    groups = {kind: sorted(sorted(int(r) for r in g) for g in as_dict["groups"][kind]) for kind in GROUP_KINDS}
    return RankLayout(sizes={k: int(v) for k, v in as_dict["sizes"].items()}, coords=coords, groups=groups)


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
