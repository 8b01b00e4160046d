"""Topology planner: every rank's place, coordinates and process groups.

``plan(spec)`` is pure (no processes, no I/O) and linear in the number of
ranks, so a 17-node, 64-policy-rank job plans in milliseconds.

Policy ranks follow Megatron-core's order ``tp-cp-ep-dp-pp`` (first name
varies fastest) on two grids over the *same* global ranks:

- dense grid (attention, embeddings): ``tp x cp x dp x pp`` (ep = 1),
  ``rank = tp + TP*(cp + CP*(dp + DP*pp))``;
- expert grid (MoE layers): ``etp x ep x edp x pp`` (cp = 1), with
  ``EDP = TP*CP*DP / (ETP*EP)``: inside each pipeline stage the TP*CP*DP
  ranks are re-factored as ETP*EP*EDP ("MoE parallel folding").

A group of kind K (e.g. ``dp_cp``) is the set of ranks that differ only in
K's coordinates. Invariants (tested): rank <-> coords is a bijection on each
grid; the groups of one kind partition ``range(world)``; every group of a
kind has the product of its dims' sizes as its length; group lists are
ordered by their smallest rank and each group is ascending (which is also
Megatron's enumeration order).

Rollout ranks are numbered densely from 0: ``engines x (tp x pp)`` with
``rank = rank_prefix(engine) + tp + TP*pp``, ``rank_prefix = engine*TP*PP``.

Placement: device slots are numbered densely over the device-bearing nodes;
slot s is node ``head + s // gpus_per_node`` (``head`` = 1 when a CPU-only
head node 0 exists), local device ``s % gpus_per_node``. Policy rank g uses
slot g; rollout rank r uses slot r when colocated, else slot
``policy_world + r``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import prod
from typing import Any

from harness.spec.constraints import check_spec, policy_world, stage_layers
from harness.spec.errors import TopologyError

# Group kinds -> the grid dims that vary inside one group.
DENSE_GROUP_KINDS: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "cp": ("cp",),
    "dp": ("dp",),
    "pp": ("pp",),
    "dp_cp": ("cp", "dp"),
    "tp_cp": ("tp", "cp"),
    "mp": ("tp", "pp"),  # Megatron's model-parallel group ("tp-pp")
    "tp_dp_cp": ("tp", "cp", "dp"),  # all ranks of one pipeline stage
}
EXPERT_GROUP_KINDS: dict[str, tuple[str, ...]] = {
    "etp": ("etp",),
    "ep": ("ep",),
    "edp": ("edp",),
    "tp_ep": ("etp", "ep"),  # Megatron's expert "tp-ep" (token-count all-gather)
    "tp_ep_pp": ("etp", "ep", "pp"),  # expert model-parallel
}
ROLLOUT_GROUP_KINDS: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "pp": ("pp",),
    "engine": ("tp", "pp"),
}
POLICY_COORDS = ("tp", "cp", "dp", "pp", "ep", "etp", "edp")
ROLES = ("policy", "rollout")


@dataclass(frozen=True)
class Grid:
    """A mixed-radix grid: ``dims`` are (name, size) pairs, fastest first."""

    dims: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        sizes = dict(self.dims)
        if sizes.get("ep", 1) > 1 and sizes.get("cp", 1) > 1:
            # Megatron's RankGenerator asserts this; it is why there are two grids.
            raise TopologyError("policy.cp", "not (ep > 1 and cp > 1) in one rank grid",
                                "a single rank grid cannot have both ep > 1 and cp > 1 (use the dense/expert split)")
        for name, size in self.dims:
            if size < 1:
                raise TopologyError(name, f"{name} >= 1", f"grid size {name}={size} must be >= 1")

    @property
    def size(self) -> int:
        return prod(size for _, size in self.dims)

    def coords(self, rank: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, size in self.dims:
            rank, out[name] = divmod(rank, size)
        return out

    def rank(self, coords: dict[str, int]) -> int:
        rank, stride = 0, 1
        for name, size in self.dims:
            rank += coords[name] * stride
            stride *= size
        return rank

    def groups(self, varying: tuple[str, ...]) -> list[list[int]]:
        """Ranks that differ only in ``varying``; ordered by smallest rank."""
        fixed = [i for i, (name, _) in enumerate(self.dims) if name not in varying]
        by_key: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.size):
            c = self.coords(rank)
            values = list(c.values())
            by_key.setdefault(tuple(values[i] for i in fixed), []).append(rank)
        return sorted(by_key.values(), key=lambda g: g[0])


@dataclass(frozen=True)
class RankInfo:
    """One rank of one role: where it runs and where it sits in the grids."""

    rank: int
    node: int
    device: int
    coords: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "device": self.device, "coords": dict(self.coords)}


@dataclass(frozen=True)
class RoleLayout:
    """All ranks of one role (``policy`` or ``rollout``) and its groups."""

    role: str
    world: int
    sizes: dict[str, int]
    ranks: tuple[RankInfo, ...]
    groups: dict[str, list[list[int]]]

    @cached_property
    def _group_of(self) -> dict[str, list[list[int]]]:
        index: dict[str, list[list[int]]] = {}
        for kind, groups in self.groups.items():
            member: list[list[int]] = [[] for _ in range(self.world)]
            for group in groups:
                for rank in group:
                    member[rank] = group
            index[kind] = member
        return index

    def groups_of(self, rank: int) -> dict[str, list[int]]:
        """{kind: the ranks of ``rank``'s group of that kind}."""
        self._check(rank)
        return {kind: list(members[rank]) for kind, members in self._group_of.items()}

    def group_index(self, kind: str, rank: int) -> int:
        """Position of ``rank``'s group in ``groups[kind]``."""
        self._check(rank)
        first = self._group_of[kind][rank][0]
        return next(i for i, g in enumerate(self.groups[kind]) if g[0] == first)

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.world:
            raise TopologyError(f"{self.role}.rank", f"0 <= rank < {self.world}",
                                f"{self.role} rank {rank} does not exist (world {self.world})")

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "world": self.world,
            "sizes": dict(self.sizes),
            "ranks": [r.to_dict() for r in self.ranks],
            "groups": {k: [list(g) for g in v] for k, v in self.groups.items()},
        }


@dataclass(frozen=True)
class EngineInfo:
    """One generation engine: its first rollout rank and all its ranks."""

    engine: int
    rank_prefix: int
    ranks: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "rank_prefix": self.rank_prefix, "ranks": list(self.ranks)}


@dataclass(frozen=True)
class NodeInfo:
    node: int
    kind: str  # "head" (CPU only, no device slots) | "worker"
    devices: int

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "kind": self.kind, "devices": self.devices}


@dataclass(frozen=True)
class Topology:
    """The planned layout of a workload. ``to_dict()`` is JSON-able and is
    what the runner stores in run.json and the topology surface reads."""

    workload: str
    device: str
    placement: str  # "colocated" | "separate"
    nodes: tuple[NodeInfo, ...]
    policy: RoleLayout
    rollout: RoleLayout
    engines: tuple[EngineInfo, ...]
    stage_layers: tuple[int, ...]
    local_experts: int
    devices_used: int
    teacher: RoleLayout | None = None  # distillation workloads only (harness.spec.distill)

    @property
    def groups(self) -> dict[str, dict[str, list[list[int]]]]:
        """``{"policy": {kind: [[ranks]]}, "rollout": {...}}`` (read-only view)."""
        groups = {"policy": self.policy.groups, "rollout": self.rollout.groups}
        if self.teacher is not None:
            groups["teacher"] = self.teacher.groups
        return groups

    def role(self, name: str) -> RoleLayout:
        if name == "teacher" and self.teacher is not None:
            return self.teacher
        if name not in ROLES:
            raise TopologyError("role", "role in (policy, rollout)", f"unknown role {name!r}")
        return self.policy if name == "policy" else self.rollout

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "device": self.device,
            "placement": self.placement,
            "nodes": [n.to_dict() for n in self.nodes],
            "policy": self.policy.to_dict(),
            "rollout": self.rollout.to_dict(),
            "engines": [e.to_dict() for e in self.engines],
            "stage_layers": list(self.stage_layers),
            "local_experts": self.local_experts,
            "devices_used": self.devices_used,
            **({"teacher": self.teacher.to_dict()} if self.teacher is not None else {}),
        }


def dense_grid(policy: dict[str, Any]) -> Grid:
    """Attention grid, order tp-cp-(ep=1)-dp-pp."""
    return Grid((("tp", policy["tp"]), ("cp", policy["cp"]), ("dp", policy["dp"]), ("pp", policy["pp"])))


def expert_grid(policy: dict[str, Any]) -> Grid:
    """MoE grid, order (etp)-(cp=1)-ep-(edp)-pp; requires the folding rule."""
    stage = policy["tp"] * policy["cp"] * policy["dp"]
    edp = stage // (policy["etp"] * policy["ep"])
    return Grid((("etp", policy["etp"]), ("ep", policy["ep"]), ("edp", edp), ("pp", policy["pp"])))


def _slot(slot: int, gpus_per_node: int, head: int) -> tuple[int, int]:
    node, device = divmod(slot, gpus_per_node)
    return node + head, device


def _plan_policy(spec: dict[str, Any], gpn: int, head: int) -> RoleLayout:
    return plan_policy_role(spec, gpn, head)


def plan_policy_role(spec: dict[str, Any], gpn: int, head: int, *, role: str = "policy",
                     first_slot: int = 0) -> RoleLayout:
    """The ranks of ``spec.policy`` as role ``role``; rank g on device slot ``first_slot + g``
    (the teacher of a distillation workload: ``harness.spec.distill``)."""
    p = spec["policy"]
    dense, expert = dense_grid(p), expert_grid(p)
    world = dense.size
    assert expert.size == world, "folding rule guarantees equal grid sizes"
    ranks = []
    for g in range(world):
        coords = {**dense.coords(g), **expert.coords(g)}
        node, device = _slot(first_slot + g, gpn, head)
        ranks.append(RankInfo(g, node, device, {k: coords[k] for k in POLICY_COORDS}))
    groups = {kind: dense.groups(dims) for kind, dims in DENSE_GROUP_KINDS.items()}
    groups.update({kind: expert.groups(dims) for kind, dims in EXPERT_GROUP_KINDS.items()})
    sizes = {k: p[k] for k in ("tp", "cp", "dp", "pp", "ep", "etp")}
    sizes["edp"] = dict(expert.dims)["edp"]
    return RoleLayout(role, world, sizes, tuple(ranks), groups)


def _plan_rollout(spec: dict[str, Any], gpn: int, head: int) -> tuple[RoleLayout, tuple[EngineInfo, ...]]:
    r = spec["rollout"]
    grid = Grid((("tp", r["tp"]), ("pp", r["pp"]), ("engine", r["engines"])))
    offset = 0 if r["colocated"] else policy_world(spec)
    ranks = []
    for rank in range(grid.size):
        node, device = _slot(offset + rank, gpn, head)
        c = grid.coords(rank)
        ranks.append(RankInfo(rank, node, device, {"engine": c["engine"], "tp": c["tp"], "pp": c["pp"]}))
    groups = {kind: grid.groups(dims) for kind, dims in ROLLOUT_GROUP_KINDS.items()}
    per_engine = r["tp"] * r["pp"]
    engines = tuple(
        EngineInfo(e, e * per_engine, tuple(range(e * per_engine, (e + 1) * per_engine))) for e in range(r["engines"])
    )
    sizes = {"engines": r["engines"], "tp": r["tp"], "pp": r["pp"], "ep": r["ep"]}
    return RoleLayout("rollout", grid.size, sizes, tuple(ranks), groups), engines


def plan(spec: dict[str, Any]) -> Topology:
    """Validate the layout constraints and lay out every rank.

    ``spec`` is a loaded spec (``load_spec``: defaults filled). Raises
    ``TopologyError`` naming the field and rule of the first violation.
    A run works its layout out once, in ``harness.spec.runplan.build_plan``; everything
    after reads the ``RunPlan``'s topology.
    """
    check_spec(spec)
    return lay_out(spec)


def lay_out(spec: dict[str, Any]) -> Topology:
    """Every rank of a spec whose layout rules hold (:func:`plan` checks them first; call
    this directly only with a spec already checked, as ``spec.runplan`` does)."""
    plat = spec["platform"]
    gpn, head = plat["gpus_per_node"], 1 if plat["head_node"] else 0
    policy = _plan_policy(spec, gpn, head)
    rollout, engines = _plan_rollout(spec, gpn, head)
    nodes = tuple([NodeInfo(0, "head", 0)] if head else []) + tuple(
        NodeInfo(head + i, "worker", gpn) for i in range(plat["nodes"])
    )
    used = policy.world + (0 if spec["rollout"]["colocated"] else rollout.world)
    teacher = None
    if spec.get("distill") is not None:
        from harness.spec.distill import TEACHER_ROLE, teacher_spec

        # its own ranks, on the device slots after the student's (and a separate rollout's)
        teacher = plan_policy_role(teacher_spec(spec), gpn, head, role=TEACHER_ROLE, first_slot=used)
        used += teacher.world
    return Topology(
        workload=spec["name"],
        device=plat["device"],
        placement="colocated" if spec["rollout"]["colocated"] else "separate",
        nodes=nodes,
        policy=policy,
        rollout=rollout,
        engines=engines,
        stage_layers=tuple(stage_layers(spec)),
        local_experts=spec["model"]["experts"] // spec["policy"]["ep"],
        devices_used=used,
        teacher=teacher,
    )


def policy_grid(policy: dict[str, Any]) -> RoleLayout:
    """The policy ranks' coordinates and groups from the ``policy`` block alone (the sizes
    tp cp dp pp ep etp; rank g on device slot g of one node): what a policy world built
    without a whole run's plan uses (``harness.parallel.groups.layout_from_spec``), the same
    grid :func:`plan` lays out."""
    return plan_policy_role({"policy": policy}, max(1, int(policy["tp"]) * int(policy["cp"])
                                                    * int(policy["dp"]) * int(policy["pp"])), 0)


def rank_groups(topology: Topology, rank: int, role: str = "policy") -> dict[str, list[int]]:
    """{group kind: members of ``rank``'s group} for one rank of ``role``."""
    return topology.role(role).groups_of(rank)


def coords_of(topology: Topology, role: str, rank: int) -> dict[str, int]:
    """Grid coordinates of one rank (policy: tp cp dp pp ep etp edp;
    rollout: engine tp pp)."""
    layout = topology.role(role)
    layout._check(rank)
    return dict(layout.ranks[rank].coords)
