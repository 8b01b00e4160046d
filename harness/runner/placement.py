"""Placement from the plan: one placement group, every rank pinned to its planned slot.

``Placement.create(spec, topology, say)`` (Ray connected) maps planned nodes to
Ray nodes (``capacity.assign_nodes``) and creates **one** placement group with a
bundle per planned device slot (``capacity.slot_resources``), in slot order.
Each bundle carries the label selector ``ray.io/node-id = <its Ray node>``
(Ray >= 2.49: ``bundle_label_selector``; every node has that label), so the
bundles of a planned node are packed on exactly that node and different planned
nodes land on different Ray nodes. Ray has no strategy that mixes "pack within,
spread across" in one group; the per-bundle node label gives both, keeps one
group (one atomic reservation: all or nothing), and needs no custom resources
on the user's cluster.

``options(role, rank)`` are the actor options that pin a policy rank (bundle of
its slot) or a rollout engine (bundle of its first rank's slot; its other TP
ranks are its processes on that node). Actors keep ``num_cpus=0``: Ray still
charges each a sliver of the bundle's own ``bundle_group_<i>_<pg>`` resource,
which is how an actor learns the bundle it actually got (``observe``).

``options("teacher", r)`` pins a distillation teacher's rank r to its planned slot.

``record(run_dir, policy_workers, rollout_workers, teacher_workers)`` asks every actor where it
runs (Ray node id, the bundle it holds, node address) and writes
``placement.json``: the planned-node -> Ray-node map and, per rank, planned and
actual node and device. Postflight (``harness.postflight.placement``) refuses a
run whose placement differs from the plan. Machine names live only in that
artifact, never in a surface.

``driver_node_options()`` keeps the data-plane actor on the driver's node when the
run spans nodes (the driver reads its SQLite file directly).

``GOLDEN_PLANT_PLACEMENT_SWAP=ROLE:A,B`` (a planted fault for the self-test, like
``harness.mutations``) pins rank A to rank B's bundle and B to A's.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from harness.runner import capacity
from harness.runner.cluster import driver_node_id, node_views
from harness.spec.typed import Workload

PLACEMENT_FILE = "placement.json"
READY_TIMEOUT_S = 120
SWAP_ENV = "GOLDEN_PLANT_PLACEMENT_SWAP"
_NODE_LABEL = "ray.io/node-id"
_BUNDLE = re.compile(r"^bundle_group_(\d+)_([0-9a-f]+)$")


def slot_of(topology: dict, role: str, rank: int) -> int:
    """The planned device slot of a rank (slot order = bundle order)."""
    info = topology[role]["ranks"][rank]
    per_node = _per_node(topology)
    first = _device_nodes(topology).index(info["node"])
    return first * per_node + info["device"]


def _per_node(topology: dict) -> int:
    return max(n["devices"] for n in topology["nodes"])


def _device_nodes(topology: dict) -> list[int]:
    return capacity.device_nodes(topology)


def _swap() -> tuple[str, int, int] | None:
    raw = os.environ.get(SWAP_ENV)
    if not raw:
        return None
    role, _, pair = raw.partition(":")
    a, _, b = pair.partition(",")
    return role, int(a), int(b)


class Placement:
    """The run's placement group and the planned-node -> Ray-node map."""

    def __init__(self, spec: dict, topology: dict, mapping: dict[int, capacity.NodeView], pg) -> None:
        self.spec = spec
        self.topology = topology
        self.mapping = mapping
        self.pg = pg
        self._swap = _swap()

    @classmethod
    def create(cls, spec: Workload, topology: dict, *, where: str, local: bool = False) -> Placement:
        """``local``: the run's own private instance (bundles reserve CPUs only, see
        ``capacity.slot_resources``)."""
        gpus = not local
        mapping = capacity.assign_nodes(spec, topology, node_views(), driver_node=driver_node_id(), where=where,
                                        gpus=gpus)
        per_node = _per_node(topology)
        slot = capacity.slot_resources(spec.platform.device, gpus=gpus)
        bundles, selectors = [], []
        for planned in _device_nodes(topology):
            for _ in range(per_node):
                bundles.append(dict(slot))
                selectors.append({_NODE_LABEL: mapping[planned].node_id})
        pg = placement_group(bundles, strategy="PACK", bundle_label_selector=selectors,
                             name=f"golden-{topology['workload']}-{os.getpid()}")
        try:
            ray.get(pg.ready(), timeout=READY_TIMEOUT_S)
        except Exception as exc:  # reported with the cluster state, then re-raised
            remove_placement_group(pg)
            raise RuntimeError(f"placement group of {len(bundles)} bundles not ready in {READY_TIMEOUT_S}s "
                               f"({where}; another job may hold the resources): {exc}") from exc
        return cls(spec, topology, mapping, pg)

    @property
    def spans_nodes(self) -> bool:
        return len({n.node_id for n in self.mapping.values()}) > 1

    def rank0_address(self) -> str:
        """The reachable address of the node planned for policy rank 0."""
        return self.mapping[self.topology["policy"]["ranks"][0]["node"]].address

    def driver_node_options(self) -> dict[str, Any]:
        """Actor options keeping a driver-side actor (the data plane) on the driver's node;
        none when the run does not span nodes."""
        if not self.spans_nodes:
            return {}
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=driver_node_id(), soft=False)}

    def bundle(self, role: str, rank: int) -> int:
        if self._swap is not None and self._swap[0] == role and rank in self._swap[1:]:
            a, b = self._swap[1:]
            rank = b if rank == a else a
        return slot_of(self.topology, role, rank)

    def options(self, role: str, rank: int) -> dict[str, Any]:
        """Actor options pinning ``role`` rank ``rank`` (a rollout engine: its first rank)."""
        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
            self.pg, placement_group_bundle_index=self.bundle(role, rank))}

    def record(self, run_dir: Path, policy_workers: list, rollout_workers: list,
               teacher_workers: list | tuple = ()) -> dict:
        """Ask every actor where it runs and write ``placement.json`` (returned)."""
        teacher_workers = list(teacher_workers)
        refs = [w.__ray_call__.remote(_where) for w in [*policy_workers, *rollout_workers, *teacher_workers]]
        seen = ray.get(refs, timeout=READY_TIMEOUT_S)
        n_policy, n_rollout = len(policy_workers), len(rollout_workers)
        policy_seen, rollout_seen = seen[:n_policy], seen[n_policy:n_policy + n_rollout]
        teacher_seen = seen[n_policy + n_rollout:]
        by_node_id = {v.node_id: k for k, v in self.mapping.items()}
        per_node = _per_node(self.topology)
        dev_nodes = _device_nodes(self.topology)

        def actual(where: dict, extra: int = 0) -> dict:
            bundle = where["bundle"]
            node = by_node_id.get(where["node_id"])
            device = None if bundle is None else bundle % per_node + extra
            bundle_node = None if bundle is None else dev_nodes[bundle // per_node]
            return {"node": node, "device": device, "bundle": bundle, "bundle_node": bundle_node,
                    "node_id": where["node_id"], "address": where["address"], "pid": where["pid"]}

        ranks = []
        for r, info in enumerate(self.topology["policy"]["ranks"]):
            ranks.append({"role": "policy", "rank": r, "planned": {"node": info["node"], "device": info["device"]},
                          "actual": actual(policy_seen[r]), "source": "actor"})
        if teacher_seen:
            for r, info in enumerate(self.topology["teacher"]["ranks"]):
                ranks.append({"role": "teacher", "rank": r,
                              "planned": {"node": info["node"], "device": info["device"]},
                              "actual": actual(teacher_seen[r]), "source": "actor"})
        rollout_ranks = self.topology["rollout"]["ranks"]
        for engine, where in zip(self.topology["engines"], rollout_seen):
            for k, r in enumerate(engine["ranks"]):
                info = rollout_ranks[r]
                ranks.append({"role": "rollout", "rank": r,
                              "planned": {"node": info["node"], "device": info["device"]},
                              "actual": actual(where, extra=k),
                              "source": "actor" if k == 0 else f"engine {engine['engine']} process (actor's node)"})
        doc = {"version": 1, "placement_group": self.pg.id.hex(),
               "nodes": [{"node": k, "node_id": v.node_id, "address": v.address} for k, v in self.mapping.items()],
               "ranks": ranks}
        path = Path(run_dir) / PLACEMENT_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
        return doc

    def remove(self) -> None:
        try:
            remove_placement_group(self.pg)
        except Exception:  # noqa: BLE001 - best effort at teardown; the job's end frees it too
            pass


def _where(actor_self: Any) -> dict:
    """Run inside an actor (``__ray_call__``): its node, the bundle it holds, its address, pid."""
    ctx = ray.get_runtime_context()
    bundle = None
    try:
        held = ray._private.worker.global_worker.core_worker.resource_ids()
        for name in held:
            m = _BUNDLE.match(name)
            if m:
                bundle = int(m.group(1))
    except Exception:  # noqa: BLE001 - a Ray without it: the node is still checked
        bundle = None
    return {"node_id": ctx.get_node_id(), "bundle": bundle, "address": ray.util.get_node_ip_address(),
            "pid": os.getpid()}
