"""Goldens on a real multi-node Ray cluster, started here (docs/cluster.md).

One ``ray.cluster_utils.Cluster`` for the module: a head and a worker raylet, each
its own Ray node with 4 logical CPUs (the box has 2 cores; every actor still runs at
``num_cpus=0`` inside its placement-group bundle). On it:

* the flagship layout over 2 nodes x 4 slots (``qwen3_moe_tiny_2node``) runs through
  ``flows.execute(..., ray_address=...)`` and its gated surfaces equal the stored
  ``cpu-cluster`` golden; ``placement.json`` shows ranks 0-3 on one Ray node and
  4-7 on the other, and the cluster is still up afterwards (the run only joined it);
* a planted placement swap (``GOLDEN_PLANT_PLACEMENT_SWAP``: policy ranks 3 and 4
  pinned to each other's bundles) is scheduled for real on this cluster (stand-in
  actors: each lands on the other node) and postflight's rule names both ranks; the
  completed 2-node run with that swap in its ``placement.json`` gets no verdict
  (``NoVerdict``, exit 3). (``benches/local_cluster.py`` with the variable set runs a
  whole swapped check: exit 3, docs/cluster.md);
* a distillation teacher's ranks are pinned to the bundles of their planned slots and
  listed in ``placement.json`` (stand-in actors; a planted teacher swap is named);
* a plan the cluster cannot hold is refused by ``golden check`` with exit 2 before
  anything starts, naming the nodes and their CPUs;
* zmq refit across nodes: the smoke workload with its (separate) rollout engine planned
  on node 1 and policy rank 0 on node 0 refits over ``tcp://`` (the bytes in the
  messages), and its rollouts and training surfaces equal those of the same layout on
  one node, where the refit runs over ``ipc://`` with shared memory (a wrong byte in any
  refit changes the next step's tokens and losses); run from a process with a warm
  runtime, it starts cold and says why;
* the tcp:// stream itself between actors pinned to policy rank 0's slot (node 0) and the
  engine's (node 1): every tensor arrives bit for bit;
* resume on the cluster: that run, its driver SIGKILLed after the checkpoint of step 2,
  is refused without an address and resumes with one, with the uninterrupted run's
  gated surfaces.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from harness import flows
from suites.stored_goldens import stored_dir

pytestmark = pytest.mark.slow

WORKLOAD = "qwen3_moe_tiny_2node"
PLATFORM = "cpu-cluster"


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
    try:
        c.add_node(num_cpus=4)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()


def _alive_nodes(address: str) -> int:
    import ray

    ray.init(address=address, log_to_driver=False)
    try:
        return sum(1 for n in ray.nodes() if n["Alive"])
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def two_node_run(cluster, tmp_path_factory):
    execution = flows.execute(WORKLOAD, run_dir=tmp_path_factory.mktemp("two_node") / "run", platform=PLATFORM,
                              ray_address=cluster.address)
    assert execution.ok, execution.problems()
    return execution


def test_two_node_golden_at_parity_placed_as_planned(cluster, two_node_run) -> None:
    verdict = flows.compare_with_golden(two_node_run, stored_dir(WORKLOAD, PLATFORM).name)
    assert verdict.ok, [(f.surface, f.section, f.path) for f in verdict.findings][:5]
    doc = json.loads((two_node_run.run_dir / "placement.json").read_text())
    node_of = {(r["role"], r["rank"]): r["actual"]["node_id"] for r in doc["ranks"]}
    policy = [node_of[("policy", r)] for r in range(8)]
    assert len(set(policy[:4])) == 1 and len(set(policy[4:])) == 1 and policy[0] != policy[4]
    assert node_of[("rollout", 0)] == policy[0]  # the engine beside the zmq sender
    assert [r["actual"]["bundle"] for r in doc["ranks"] if r["role"] == "policy"] == list(range(8))
    checks = {c["name"]: c for c in two_node_run.postflight.checks}
    assert checks["placement_as_planned"]["outcome"] == "pass"
    topology = two_node_run.postflight.surfaces["topology"]
    assert "node_id" not in json.dumps(topology) and policy[0] not in json.dumps(topology)  # node index only
    assert _alive_nodes(cluster.address) == 2  # the run joined the cluster and left it running


SWAPPED = ["policy rank 3: planned node 0 device 3, actual node 1 device 0",
           "policy rank 4: planned node 1 device 0, actual node 0 device 3"]


def test_planted_swap_is_scheduled_on_the_other_nodes(cluster, tmp_path, monkeypatch) -> None:
    import ray

    from harness.postflight.placement import placement_problems
    from harness.runner.cluster import init_ray
    from harness.runner.placement import SWAP_ENV, Placement
    from harness.spec.load import load_spec
    from harness.spec.topology import plan

    spec = load_spec(WORKLOAD)
    topo = plan(spec).to_dict()
    monkeypatch.setenv(SWAP_ENV, "policy:3,4")
    init_ray(spec, cluster.address, log_to_driver=False)
    try:
        placement = Placement.create(spec, topo, where="test cluster")

        @ray.remote(num_cpus=0)
        class Rank:  # a stand-in rank: where Ray puts it is all this checks
            def ping(self) -> int:
                return os.getpid()

        policy = [Rank.options(**placement.options("policy", r)).remote() for r in range(8)]
        rollout = [Rank.options(**placement.options("rollout", 0)).remote()]
        recorded = placement.record(tmp_path, policy, rollout)
        placement.remove()
    finally:
        ray.shutdown()
    assert placement_problems(topo, recorded) == SWAPPED
    node_ids = {(r["role"], r["rank"]): r["actual"]["node_id"] for r in recorded["ranks"]}
    assert node_ids[("policy", 3)] == node_ids[("policy", 7)] != node_ids[("policy", 4)] == node_ids[("policy", 0)]


def test_distillation_teacher_ranks_are_pinned_to_their_planned_slots(cluster, tmp_path, monkeypatch) -> None:
    """The teacher's ranks get the bundles of their planned slots (2, 3 after the student's 0, 1) and
    ``placement.json`` lists them; a planted teacher swap is named by postflight's rule."""
    import ray

    from harness.postflight.placement import placement_problems
    from harness.runner.cluster import init_ray
    from harness.runner.placement import SWAP_ENV, Placement
    from harness.spec.load import load_spec
    from harness.spec.topology import plan

    spec = load_spec("qwen3_moe_tiny_distill", ["platform.gpus_per_node=4"])
    topo = plan(spec).to_dict()
    init_ray(spec, cluster.address, log_to_driver=False)
    recorded = []
    try:
        for swap in (None, "teacher:0,1"):
            if swap:
                monkeypatch.setenv(SWAP_ENV, swap)
            placement = Placement.create(spec, topo, where="test cluster")

            @ray.remote(num_cpus=0)
            class Rank:  # a stand-in rank: where Ray puts it is all this checks
                def ping(self) -> int:
                    return os.getpid()

            actors = {role: [Rank.options(**placement.options(role, r)).remote() for r in range(n)]
                      for role, n in (("policy", 2), ("rollout", 1), ("teacher", 2))}
            recorded.append(placement.record(tmp_path, actors["policy"], actors["rollout"],
                                             teacher_workers=actors["teacher"]))
            for group in actors.values():
                for a in group:
                    ray.kill(a)
            placement.remove()
    finally:
        ray.shutdown()
    placed, swapped = recorded
    teacher = [r for r in placed["ranks"] if r["role"] == "teacher"]
    assert [(r["rank"], r["planned"]["device"], r["actual"]["bundle"]) for r in teacher] == [(0, 2, 2), (1, 3, 3)]
    assert placement_problems(topo, placed) == []
    on_disk = json.loads((tmp_path / "placement.json").read_text())["ranks"]
    assert [r["role"] for r in on_disk].count("teacher") == 2
    assert placement_problems(topo, swapped) == [
        "teacher rank 0: planned node 0 device 2, actual node 0 device 3",
        "teacher rank 1: planned node 0 device 3, actual node 0 device 2",
    ]


def test_a_run_placed_against_the_plan_gets_no_verdict(two_node_run, tmp_path) -> None:
    from harness.postflight.read import NoVerdict, load_run
    from harness.postflight.run import postflight

    run = tmp_path / "run"
    shutil.copytree(two_node_run.run_dir, run, ignore=shutil.ignore_patterns("ipc"))  # sockets do not copy
    doc = json.loads((run / "placement.json").read_text())
    a, b = doc["ranks"][3]["actual"], doc["ranks"][4]["actual"]  # ranks 3 and 4 ran on each other's slots
    doc["ranks"][3]["actual"], doc["ranks"][4]["actual"] = b, a
    (run / "placement.json").write_text(json.dumps(doc))
    result = postflight(run)
    assert result.status == "incomplete"
    assert [c["detail"] for c in result.failed_checks] == ["; ".join(SWAPPED)]
    with pytest.raises(NoVerdict, match=r"check placement_as_planned failed: policy rank 3: planned node 0 "
                                        r"device 3, actual node 1 device 0"):
        load_run(run)


def test_a_cluster_too_small_is_refused_before_anything_starts(cluster, tmp_path, capsys) -> None:
    from harness.cli import main

    run_dir = tmp_path / "run"
    cmd = ["check", WORKLOAD, "--platform", PLATFORM, "--ray-address", cluster.address, "--run-dir", str(run_dir), "-q"]
    assert main([*cmd, "platform.nodes=3"]) == 2
    err = capsys.readouterr().err
    assert (f"golden check: platform.ray_address: ray cluster {cluster.address} has 2 alive node(s), the plan needs "
            "3 node(s) (3 x 4 cpu slots, each node CPU >= 4)") in err
    assert main([*cmd, "platform.nodes=1", "platform.gpus_per_node=8"]) == 2
    err = capsys.readouterr().err
    assert "only 0 of 2 alive node(s) can hold 8 cpu slots (CPU >= 8)" in err
    assert err.count(": 4 CPU, 0 GPU") == 2  # both nodes named with their CPUs
    assert not run_dir.exists()


SMOKE = "qwen3_moe_tiny_smoke"
# the separate rollout engine refits over zmq; 4 steps, a checkpoint after each (room to kill and resume)
ACROSS = ("rollout.colocated=false", "rollout.refit.transport=zmq", "grpo.iterations=4", "grpo.checkpoint_every=1")
TWO_NODES = ("platform.nodes=2", "platform.gpus_per_node=1")  # policy rank 0 on node 0, the engine on node 1


@pytest.fixture(scope="module")
def across_run(cluster, tmp_path_factory):
    """The smoke layout with its engine on the other node, run from a pytest process that has a
    warm runtime: the run goes cold on the cluster and says why."""
    from harness.runner.warm import WarmRuntime

    said: list[str] = []
    execution = flows.execute(SMOKE, run_dir=tmp_path_factory.mktemp("across") / "run", ray_address=cluster.address,
                              overrides=(*ACROSS, *TWO_NODES), warm=WarmRuntime(), say=said.append)
    assert execution.ok, execution.problems()
    return execution, said


def test_zmq_refit_across_nodes_goes_over_tcp_and_equals_the_ipc_run(cluster, across_run, tmp_path) -> None:
    across, said = across_run
    within = flows.execute(SMOKE, run_dir=tmp_path / "within", ray_address=cluster.address,
                           overrides=(*ACROSS, "platform.nodes=1", "platform.gpus_per_node=2"))
    assert within.ok, within.problems()
    placed = json.loads((across.run_dir / "placement.json").read_text())
    node_of = {(r["role"], r["rank"]): r["actual"]["node_id"] for r in placed["ranks"]}
    assert node_of[("rollout", 0)] != node_of[("policy", 0)]  # the engine really ran on the other node
    [tcp] = json.loads((across.run_dir / "refit_endpoints.json").read_text())["engines"]
    assert tcp["scheme"] == "tcp" and tcp["cross_node"] and tcp["addresses"][0].startswith("tcp://")
    [ipc] = json.loads((within.run_dir / "refit_endpoints.json").read_text())["engines"]
    assert ipc["scheme"] == "ipc" and not ipc["cross_node"]
    for surface in ("rollouts", "training"):
        assert across.postflight.surfaces[surface] == within.postflight.surfaces[surface], surface
    assert any(m.startswith(f"cold start on the Ray cluster at {cluster.address}: warm processes live in this "
                            "machine's private Ray instance and are not placed") for m in said), said[:5]


def test_tcp_refit_stream_between_two_ray_nodes_is_bit_exact(cluster) -> None:
    """The stream itself between actors pinned to the plan's slots on two Ray nodes: the
    sender (policy rank 0's slot, node 0) binds as the refitter has it do, the receiver
    (the engine's slot, node 1) gets every tensor bit for bit."""
    import ray
    import torch

    from harness.refit import tcp_stream
    from harness.runner.cluster import init_ray
    from harness.runner.placement import Placement
    from harness.spec.load import load_spec
    from harness.spec.topology import plan

    def state() -> dict:
        gen = torch.Generator().manual_seed(7)
        sd = {f"w{i}": torch.randn(37 * i + 5, generator=gen) for i in range(20)}
        sd["big"] = torch.randn(64, 300, generator=gen)  # larger than half the budget: sent alone
        sd["bf16"] = torch.randn(33, generator=gen).to(torch.bfloat16)
        return sd

    spec = load_spec(SMOKE, [*ACROSS, *TWO_NODES])
    topo = plan(spec).to_dict()
    init_ray(spec, cluster.address, log_to_driver=False)
    try:
        placement = Placement.create(spec, topo, where="test cluster")

        @ray.remote(num_cpus=0)
        class Sender:
            def send(self, address: str) -> int:
                from harness.refit.zmq_stream import send_weights_zmq

                return send_weights_zmq(state().items(), address=address, buffer_size_bytes=16384,
                                        timeout_ms=60_000).groups

            def node(self) -> str:
                return ray.get_runtime_context().get_node_id()

        @ray.remote(num_cpus=0)
        class Receiver:
            def receive(self, address: str, info: dict) -> dict:
                from harness.refit.zmq_stream import receive_weights_zmq

                got: dict = {}
                receive_weights_zmq(address=address, state_dict_info=info, timeout_ms=60_000,
                                    load_fn=lambda views: got.update({n: v.clone() for n, v in views}))
                return got

            def node(self) -> str:
                return ray.get_runtime_context().get_node_id()

        sender = Sender.options(**placement.options("policy", 0)).remote()
        receiver = Receiver.options(**placement.options("rollout", 0)).remote()
        assert ray.get(sender.node.remote()) != ray.get(receiver.node.remote())
        [address] = ray.get(sender.__ray_call__.remote(tcp_stream.bind_in_actor, 1, 60_000))
        expected = state()
        info = {n: (tuple(t.shape), t.dtype) for n, t in expected.items()}
        got = receiver.receive.remote(address, info)
        groups = ray.get(sender.send.remote(address))
        received = ray.get(got)
        ray.kill(sender)
        ray.kill(receiver)
        placement.remove()
    finally:
        ray.shutdown()
    assert address.startswith("tcp://") and groups > 2
    assert list(received) == list(expected)
    for name, tensor in expected.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name].view(torch.uint8),
                                                                    tensor.view(torch.uint8)), name


GATED = ("topology", "lifecycle", "operators", "collectives", "rollouts", "training")


def test_a_killed_two_node_run_resumes_on_the_cluster(cluster, across_run, tmp_path) -> None:
    """Driver SIGKILLed after the checkpoint of step 2 (its actors die with its job; the cluster
    stays); without an address the resume is refused (a private instance is one node); with
    ``ray_address`` it finishes on the cluster with the uninterrupted run's surfaces."""
    from harness.runner.capacity import ClusterRefused
    from harness.surfaces.canonical import canonical_bytes
    from suites.kill_run import run_until_checkpoint_then_kill

    reference, _ = across_run
    run_dir = tmp_path / "killed"
    run_until_checkpoint_then_kill([SMOKE, *ACROSS, *TWO_NODES, "--ray-address", cluster.address], run_dir)
    with pytest.raises(ClusterRefused, match=r"the plan needs 2 nodes, but without --ray-address"):
        flows.resume(run_dir)
    resumed = flows.resume(run_dir, ray_address=cluster.address)
    assert resumed.ok, resumed.problems()
    (resume_point,) = json.loads((run_dir / "run.json").read_text())["resumed"]
    assert 2 <= resume_point["after_step"] < 4, resume_point  # from a checkpoint, not rerun from scratch
    checks = {c["name"]: c["outcome"] for c in resumed.postflight.checks}
    assert checks["placement_as_planned"] == "pass"
    for name in GATED:
        assert canonical_bytes(resumed.postflight.surfaces[name]) == canonical_bytes(
            reference.postflight.surfaces[name]), name
    assert _alive_nodes(cluster.address) == 2
