"""Can a Ray cluster hold a plan, and which Ray node plays which planned node.

Pure (no ray, no torch): the caller passes the cluster as ``NodeView`` records
(``harness.runner.cluster.node_views`` reads them from Ray), so the rules are
testable without a cluster.

Rules (each refusal is a ``ClusterRefused``, a ``SpecError`` on field
``platform.ray_address``, exit 2, naming nodes, GPUs and CPUs per node):

* every planned device slot needs ``slot_resources(device)`` on its node:
  one logical CPU per slot (a CPU slot on ``cpu``), plus one GPU on ``cuda`` on a
  cluster (a private local instance reserves the CPU only);
* planned device nodes map to distinct alive Ray nodes that each hold
  ``gpus_per_node`` slots; a planned CPU-only head node (``head_node: true``)
  needs one more distinct alive node and nothing on it;
* the driver's node plays planned node 0 when it qualifies (the rendezvous
  stores the driver serves then sit on rank 0's node), the rest follow in
  (address, node id) order, so the mapping is deterministic for one cluster;
* a rollout engine is one actor whose TP ranks are its own processes, so all
  ranks of an engine must be planned on one node.

``cross_node_engines`` names the engines whose zmq refit goes over ``tcp://``;
``check_distill`` refuses a distillation plan whose teacher and student are not on one
node (the teacher's logits reach the student as same-host IPC handles).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.spec.errors import SpecError
from harness.spec.typed import Workload

FIELD = "platform.ray_address"
WARM_ON_CLUSTER = ("warm processes live in this machine's private Ray instance and are not placed from the plan; "
                   "a cluster run starts fresh actors in its own placement group")
SLOT_CPU = 1.0  # logical CPUs reserved per planned device slot


class ClusterRefused(SpecError):
    """The cluster (or the private local instance) cannot hold the plan; exit 2."""

    def __init__(self, message: str) -> None:
        super().__init__(FIELD, message)


@dataclass(frozen=True)
class NodeView:
    """One Ray node as the capacity rules see it."""

    node_id: str
    address: str
    cpus: float
    gpus: float
    alive: bool = True
    labels: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.address} ({self.node_id[:8]}): {_num(self.cpus)} CPU, {_num(self.gpus)} GPU"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def slot_resources(device: str, *, gpus: bool = True) -> dict[str, float]:
    """What one planned device slot reserves in its placement-group bundle. ``gpus=False``
    (a private local instance): CPU only, as before placement existed, where ranks share
    the machine's GPUs (``harness.devices.local_device``) and the plan's
    ``gpus_per_node`` is not a count of real GPUs."""
    return {"CPU": SLOT_CPU, "GPU": 1.0} if device == "cuda" and gpus else {"CPU": SLOT_CPU}


def device_nodes(topology: dict) -> list[int]:
    """Planned node indices that carry device slots (``topology.to_dict()`` form)."""
    return [n["node"] for n in topology["nodes"] if n["devices"] > 0]


def planned_nodes_needed(topology: dict) -> int:
    return len(topology["nodes"])


def check_engines(topology: dict) -> None:
    """Every rollout engine's ranks are planned on one node (an engine is one actor)."""
    ranks = topology["rollout"]["ranks"]
    for engine in topology["engines"]:
        nodes = sorted({ranks[r]["node"] for r in engine["ranks"]})
        if len(nodes) > 1:
            raise ClusterRefused(
                f"rollout engine {engine['engine']} is planned over nodes {nodes}, but an engine is one actor "
                "whose TP ranks are its own processes on its node; choose rollout.tp <= platform.gpus_per_node "
                "so no engine straddles nodes")


def check_distill(topology: dict) -> None:
    """A distillation teacher's ranks and the student's (policy) ranks are planned on one node:
    the student opens the teacher's logits buffers by shared-memory / CUDA IPC handle
    (``harness.distill.teacher_ipc``), which another host cannot open."""
    teacher = topology.get("teacher")
    if not teacher:
        return
    student = sorted({r["node"] for r in topology["policy"]["ranks"]})
    teacher_nodes = sorted({r["node"] for r in teacher["ranks"]})
    if len(set(student) | set(teacher_nodes)) > 1:
        raise ClusterRefused(
            f"the distillation teacher is planned on node(s) {teacher_nodes} and the student on {student}, but the "
            "student reads the teacher's logits through same-host IPC handles (harness.distill.teacher_ipc), so "
            "both must be planned on one node; raise platform.gpus_per_node to hold the student, a separate "
            "rollout and the teacher on one node")


def cross_node_engines(topology: dict) -> list[int]:
    """Rollout engines planned on another node than policy rank 0 (the zmq refit sender):
    their zmq refit runs over ``tcp://`` with the bytes in the messages
    (``harness.refit.tcp_stream``); every other engine's over ``ipc://`` with shared memory."""
    sender = topology["policy"]["ranks"][0]["node"]
    ranks = topology["rollout"]["ranks"]
    return [e["engine"] for e in topology["engines"] if ranks[e["rank_prefix"]]["node"] != sender]


def assign_nodes(spec: Workload, topology: dict, nodes: list[NodeView], *, driver_node: str | None,
                 where: str, gpus: bool = True) -> dict[int, NodeView]:
    """{planned node index: the Ray node that plays it}; ``ClusterRefused`` when the cluster
    cannot hold the plan. ``where`` names the cluster in the message (its address);
    ``gpus``: as in :func:`slot_resources`."""
    plat = spec.platform  # the plan's typed workload
    per_node = plat.gpus_per_node
    need = {k: v * per_node for k, v in slot_resources(plat.device, gpus=gpus).items()}
    alive = [n for n in nodes if n.alive]
    planned = topology["nodes"]
    wanted = ", ".join(f"{k} >= {_num(v)}" for k, v in sorted(need.items()))
    summary = (f"the plan needs {len(planned)} node(s)"
               + (" (1 CPU-only head + " if plat.head_node else " (")
               + f"{plat.nodes} x {per_node} {plat.device} slots, each node {wanted})")
    listing = "; ".join(f"node {n.describe()}" for n in alive) or "no alive node"
    if len(alive) < len(planned):
        raise ClusterRefused(f"{where} has {len(alive)} alive node(s), {summary}: {listing}")

    def fits(n: NodeView) -> bool:
        have = {"CPU": n.cpus, "GPU": n.gpus}
        return all(have[k] >= v for k, v in need.items())

    ordered = sorted(alive, key=lambda n: (n.node_id != driver_node, n.address, n.node_id))
    fitting = [n for n in ordered if fits(n)]
    dev = device_nodes(topology)
    if len(fitting) < len(dev):
        short = "; ".join(f"node {n.describe()}" for n in ordered if not fits(n))
        raise ClusterRefused(f"{where}: only {len(fitting)} of {len(alive)} alive node(s) can hold "
                             f"{per_node} {plat.device} slots ({wanted}); {summary}. Too small: {short}")
    mapping = {planned_index: fitting[i] for i, planned_index in enumerate(dev)}
    spare = [n for n in ordered if n not in mapping.values()]
    for p in planned:
        if p["devices"] == 0:  # the CPU-only head: any distinct node
            if not spare:
                raise ClusterRefused(f"{where}: no node left for the CPU-only head node; {summary}: {listing}")
            mapping[p["node"]] = spare.pop(0)
    return dict(sorted(mapping.items()))


def local_refusal(topology: dict) -> ClusterRefused | None:
    """A private local Ray instance is one node: refuse a plan of more."""
    n = planned_nodes_needed(topology)
    if n <= 1:
        return None
    return ClusterRefused(f"the plan needs {n} nodes, but without --ray-address (or platform.ray_address) the run "
                          "starts a private local Ray instance, which is one node; start a cluster "
                          "(docs/cluster.md) and pass its address")
