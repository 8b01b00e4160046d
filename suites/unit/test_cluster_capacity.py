"""Cluster capacity rules and the postflight placement check (pure: no ray, no torch).

The cluster is described as ``NodeView`` records (what ``harness.runner.cluster.node_views``
reads from a live Ray); suites/cluster/test_two_node.py runs the same rules on a real
multi-node Ray cluster.
"""

from __future__ import annotations

import copy

import pytest

from harness.postflight.placement import placement_problems
from harness.runner.capacity import (
    ClusterRefused,
    NodeView,
    assign_nodes,
    check_distill,
    check_engines,
    cross_node_engines,
    local_refusal,
)
from harness.spec.load import load_spec
from harness.spec.topology import plan

TWO_NODE = "qwen3_moe_tiny_2node"


def _spec(*overrides: str) -> tuple[dict, dict]:
    spec = load_spec(TWO_NODE, overrides)
    return spec, plan(spec).to_dict()


def _node(i: int, cpus: float = 4, gpus: float = 0, alive: bool = True) -> NodeView:
    return NodeView(node_id=f"{i:02d}" + "ab" * 27, address=f"10.0.0.{i}", cpus=cpus, gpus=gpus, alive=alive)


def test_two_nodes_of_four_cpus_hold_the_plan_driver_node_first() -> None:
    spec, topo = _spec()
    nodes = [_node(1), _node(2)]
    mapping = assign_nodes(spec, topo, nodes, driver_node=nodes[1].node_id, where="c")
    assert [mapping[0].address, mapping[1].address] == ["10.0.0.2", "10.0.0.1"]  # planned node 0 = driver's


def test_too_few_nodes_is_refused_naming_every_node() -> None:
    spec, topo = _spec()
    with pytest.raises(ClusterRefused, match=r"platform.ray_address: ray cluster X has 1 alive node\(s\), the plan "
                                             r"needs 2 node\(s\) \(2 x 4 cpu slots, each node CPU >= 4\): "
                                             r"node 10.0.0.1 \(01ababab\): 4 CPU, 0 GPU"):
        assign_nodes(spec, topo, [_node(1), _node(2, alive=False)], driver_node=None, where="ray cluster X")


def test_a_node_with_too_few_cpus_is_refused_naming_it() -> None:
    spec, topo = _spec()
    with pytest.raises(ClusterRefused, match=r"only 1 of 2 alive node\(s\) can hold 4 cpu slots \(CPU >= 4\).*"
                                             r"Too small: node 10.0.0.2 \(02ababab\): 2 CPU, 0 GPU"):
        assign_nodes(spec, topo, [_node(1), _node(2, cpus=2)], driver_node=None, where="c")


def test_cuda_needs_gpus_per_node() -> None:
    spec, topo = _spec("platform.device=cuda")
    with pytest.raises(ClusterRefused, match=r"CPU >= 4, GPU >= 4.*node 10.0.0.2 \(02ababab\): 8 CPU, 2 GPU"):
        assign_nodes(spec, topo, [_node(1, 8, 4), _node(2, 8, 2)], driver_node=None, where="c")
    assert len(assign_nodes(spec, topo, [_node(1, 8, 4), _node(2, 8, 4)], driver_node=None, where="c")) == 2
    # a private local instance reserves CPUs only: its ranks share the machine's GPUs, as before placement
    assert len(assign_nodes(spec, topo, [_node(1, 8, 1), _node(2, 8, 0)], driver_node=None, where="c", gpus=False)) == 2


def test_head_node_needs_one_more_distinct_node() -> None:
    spec, topo = _spec("platform.head_node=true")
    with pytest.raises(ClusterRefused, match=r"has 2 alive node\(s\), the plan needs 3 node\(s\) \(1 CPU-only head"):
        assign_nodes(spec, topo, [_node(1), _node(2)], driver_node=None, where="c")
    mapping = assign_nodes(spec, topo, [_node(1), _node(2), _node(3, cpus=0)], driver_node=None, where="c")
    assert mapping[0].address == "10.0.0.3" and {mapping[1].address, mapping[2].address} == {"10.0.0.1", "10.0.0.2"}


def test_engine_straddling_nodes_is_refused_and_cross_node_engines_are_named() -> None:
    _, topo = _spec("platform.gpus_per_node=1", "platform.nodes=8")  # the TP2 engine spans nodes 0 and 1
    with pytest.raises(ClusterRefused, match=r"rollout engine 0 is planned over nodes \[0, 1\]"):
        check_engines(topo)
    _, topo = _spec("rollout.engines=2", "policy.tp=2")  # engine 1 on slots 2,3: still node 0 (ipc://)
    assert cross_node_engines(topo) == []
    _, topo = _spec("rollout.engines=4")  # engines 2, 3 on node 1, policy rank 0 on node 0: tcp://
    assert cross_node_engines(topo) == [2, 3]
    _, topo = _spec("rollout.colocated=false", "platform.nodes=3")  # engines after the policy: node 2
    assert cross_node_engines(topo) == [0]


def test_a_private_local_instance_refuses_a_plan_of_two_nodes() -> None:
    _, topo = _spec()
    refusal = local_refusal(topo)
    assert refusal is not None and "the plan needs 2 nodes" in str(refusal) and "--ray-address" in str(refusal)
    _, one = _spec("platform.nodes=1", "platform.gpus_per_node=8")
    assert local_refusal(one) is None


def _placement_doc(topo: dict) -> dict:
    ranks = [{"role": role, "rank": r["rank"], "planned": {"node": r["node"], "device": r["device"]},
              "actual": {"node": r["node"], "device": r["device"], "node_id": f"n{r['node']}"}}
             for role in ("policy", "rollout") for r in topo[role]["ranks"]]
    return {"version": 1, "nodes": [], "ranks": ranks}


def test_placement_as_planned_passes_and_a_swap_across_nodes_is_named() -> None:
    _, topo = _spec()
    doc = _placement_doc(topo)
    assert placement_problems(topo, doc) == []
    swapped = copy.deepcopy(doc)
    a, b = swapped["ranks"][3]["actual"], swapped["ranks"][4]["actual"]
    swapped["ranks"][3]["actual"], swapped["ranks"][4]["actual"] = b, a
    assert placement_problems(topo, swapped) == [
        "policy rank 3: planned node 0 device 3, actual node 1 device 0",
        "policy rank 4: planned node 1 device 0, actual node 0 device 3",
    ]


def test_placement_outside_the_plan_or_missing_is_named() -> None:
    _, topo = _spec()
    doc = _placement_doc(topo)
    doc["ranks"][9]["actual"]["node"] = None  # a Ray node the run did not map
    del doc["ranks"][0]
    doc["ranks"][1]["actual"]["device"] = None  # no bundle: not placed
    assert placement_problems(topo, doc) == [
        "policy rank 0: no placement recorded",
        "policy rank 2: no bundle recorded (not placed from the plan)",
        "rollout rank 1: planned node 0 device 1, actual a Ray node outside the plan device 1",
    ]
    assert placement_problems(topo, {"ranks": "x"}) == ["placement.json: no 'ranks' list"]


def test_cli_refuses_a_two_node_plan_without_a_cluster(tmp_path, capsys) -> None:
    from harness.cli import main

    run_dir = tmp_path / "run"
    assert main(["check", TWO_NODE, "--platform", "cpu-cluster", "--run-dir", str(run_dir), "-q"]) == 2
    err = capsys.readouterr().err
    assert ("golden check: platform.ray_address: the plan needs 2 nodes, but without --ray-address (or "
            "platform.ray_address) the run starts a private local Ray instance, which is one node") in err
    assert not run_dir.exists()


def test_cli_refuses_to_resume_a_two_node_run_without_a_cluster(tmp_path, capsys) -> None:
    import json

    from harness.cli import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = load_spec(TWO_NODE)
    (run_dir / "run.json").write_text(json.dumps({"spec": spec.to_dict(), "status": "running"}))
    assert main(["run", "--resume", str(run_dir), "-q"]) == 2
    err = capsys.readouterr().err
    assert ("golden run --resume: platform.ray_address: the plan needs 2 nodes, but without --ray-address (or "
            "platform.ray_address) the run starts a private local Ray instance, which is one node") in err
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"  # untouched


DISTILL = "qwen3_moe_tiny_distill"


def test_a_distillation_teacher_on_another_node_than_the_student_is_refused() -> None:
    one = plan(load_spec(DISTILL)).to_dict()
    check_distill(one)  # student slots 0-1, teacher 2-3: one node
    check_distill(_spec()[1])  # no teacher: nothing to check
    two = plan(load_spec(DISTILL, ["platform.nodes=2", "platform.gpus_per_node=2"])).to_dict()
    with pytest.raises(ClusterRefused, match=r"platform.ray_address: the distillation teacher is planned on "
                                             r"node\(s\) \[1\] and the student on \[0\].*same-host IPC handles"):
        check_distill(two)


def test_teacher_ranks_are_checked_against_the_plan() -> None:
    topo = plan(load_spec(DISTILL)).to_dict()
    ranks = [{"role": role, "rank": r["rank"], "planned": {"node": r["node"], "device": r["device"]},
              "actual": {"node": r["node"], "device": r["device"]}}
             for role in ("policy", "rollout", "teacher") for r in topo[role]["ranks"]]
    assert placement_problems(topo, {"ranks": ranks}) == []
    ranks[-1]["actual"]["device"] = 0  # teacher rank 1 on the student's first slot
    assert placement_problems(topo, {"ranks": ranks[:-2] + ranks[-1:]}) == [
        "teacher rank 0: no placement recorded",
        "teacher rank 1: planned node 0 device 3, actual node 0 device 0",
    ]


def test_cli_refuses_a_teacher_on_another_node_before_joining(tmp_path, capsys) -> None:
    from harness.cli import main

    run_dir = tmp_path / "run"
    # the address is never probed: the plan is refused first
    assert main(["check", DISTILL, "platform.nodes=2", "platform.gpus_per_node=2", "--ray-address", "127.0.0.1:1",
                 "--run-dir", str(run_dir), "-q"]) == 2
    err = capsys.readouterr().err
    assert ("golden check: platform.ray_address: the distillation teacher is planned on node(s) [1] and the "
            "student on [0]") in err and "cannot join" not in err
    assert not run_dir.exists()
