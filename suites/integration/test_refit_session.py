"""Broadcast refit through the session's ``Refitter``: a real 1-rank PolicyGroup and two real
rollout engines (in-actor sync, internal-process async) as Ray actors.

* three refits (a train step before each later one): every engine is bit-exact with the
  policy after each, and every member (policy rank 0, each engine rank) holds exactly one side
  group, built by the first refit;
* the port the Refitter hands out is already bound when anyone hears of it: a squatter that
  tries to take it at that moment fails (with pick-then-bind the squatter got the port and the
  refit failed or, worse, the engines met the squatter);
* shutdown closes every member's group (their store connections close while the actors still
  live) and the policy worker's data-plane clients; ``Refitter.close`` stops serving, last.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from pathlib import Path

import pytest
import torch

from harness.policy.synthetic import synthetic_batch
from harness.spec import load_spec
from harness.spec.topology import plan
from harness.spec.typed import as_workload
from suites.tcp_connections import settles_to

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

REFITS = 3


def _spec() -> dict:
    spec = load_spec(str(REPO / "goldens/qwen3_moe_tiny_smoke/workload.yaml")).to_dict()
    spec["rollout"] = {**spec["rollout"], "engines": 2, "tp": 1, "colocated": False,
                       "refit": {"transport": "auto", "buffer_size_bytes": 16384}}
    spec["plugins"] = {**spec["plugins"], "policy_profiler": None, "rollout_profiler": None}
    spec["capture"] = {**spec["capture"], "enabled": False}
    return spec


class SquattingPolicy:
    """The adversary, not a stand-in: forwards to the real PolicyGroup, but first tries to bind
    the side-group port it is handed (what any other process on the host could do then)."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.attempts: list[tuple[int, int | None]] = []  # (port, errno or None when the bind succeeded)

    def stream_weights(self, transport: str, **kw):
        side = kw["side_group"]
        squat = socket.socket()
        try:
            squat.bind((side["host"], int(side["port"])))
            squat.listen()
            self.attempts.append((int(side["port"]), None))
        except OSError as exc:
            self.attempts.append((int(side["port"]), exc.errno))
            squat.close()
            squat = None
        try:
            return self.policy.stream_weights(transport, **kw)
        finally:
            if squat is not None:
                squat.close()


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    from harness.dataplane.actor import DataPlaneClient, start_dataplane_actor
    from harness.grpo.refitter import Refitter
    from harness.policy.group import PolicyGroup
    from harness.rollout.worker import rollout_worker_actor

    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    run_dir = tmp_path_factory.mktemp("run")
    spec = _spec()
    policy = PolicyGroup(as_workload(spec), plan(spec), str(run_dir))
    engine_spec = {**spec, "seed": int(spec["seed"]) + 1}  # engines start from other weights than the policy
    actor = rollout_worker_actor()
    workers = [actor.remote(as_workload(engine_spec), 0, 0, str(run_dir)),
               actor.remote(as_workload({**engine_spec, "rollout": {**spec["rollout"], "async": True}}), 1, 1,
                            str(run_dir))]
    ray.get([w.ready.remote() for w in workers], timeout=300)
    dataplane = start_dataplane_actor(f"dataplane-refit-{os.getpid()}", str(run_dir / "dataplane.sqlite"))
    squatter = SquattingPolicy(policy)
    refitter = Refitter(spec, squatter, workers, run_dir)
    out = {"spec": spec, "policy": policy, "workers": workers, "refitter": refitter, "squatter": squatter,
           "dataplane": DataPlaneClient(dataplane), "records": [], "weights_equal": [], "held": []}
    try:
        batch = synthetic_batch(spec, 8, seed=0)
        for step in range(REFITS):
            if step:
                policy.train(batch)
            out["records"].append(refitter.refit(step))
            want = policy.hf_state_dict()
            out["weights_equal"].append([
                all(torch.equal(got[n], want[n]) for n in want) and list(got) == list(want)
                for got in ray.get([w.get_weights.remote() for w in workers])
            ])
            out["held"].append({
                "engines": ray.get([w.side_groups.remote() for w in workers]),
                "policy": ray.get([w.side_groups.remote() for w in policy.workers]),
                "connections": settles_to(refitter.side_group()["port"], 1 + 3),
            })
        yield out
    finally:
        for w in workers:
            with contextlib.suppress(Exception):  # teardown: the shutdown test may have shut it down
                ray.get(w.shutdown.remote(), timeout=60)
        policy.shutdown()
        refitter.close()
        ray.get(dataplane.close.remote())
        ray.shutdown()


def test_every_refit_is_bit_exact_and_versions_advance(session):
    assert session["weights_equal"] == [[True, True]] * REFITS
    assert [r["version"] for r in session["records"]] == [1, 2, 3]
    assert {r["transport"] for r in session["records"]} == {"broadcast"}


def test_one_side_group_per_member_for_the_whole_session(session):
    side = session["refitter"].side_group()
    for refit, held in enumerate(session["held"]):
        engines, policy = held["engines"], held["policy"]
        assert [[len(rank) for rank in engine] for engine in engines] == [[1], [1]], refit
        assert [len(p) for p in policy] == [1], refit  # rank 0 of a 1-rank world
        members = [engines[0][0][0], engines[1][0][0], policy[0][0]]
        assert [m["rank"] for m in members] == [1, 2, 0]
        assert {(m["port"], m["prefix"], m["world_size"], m["created"]) for m in members} == {
            (side["port"], side["prefix"], 3, 1)}, refit
        # the store's own client + one per member, however many refits ran (no groups pile up)
        assert held["connections"] == 1 + 3, refit


def test_the_handed_out_port_is_already_bound(session):
    """Pick-then-bind regression: when the port is handed out it is taken, so the squatter fails."""
    port = session["refitter"].side_group()["port"]
    assert session["squatter"].attempts == [(port, errno.EADDRINUSE)] * REFITS


def test_shutdown_closes_every_side_group_and_the_dataplane_clients(session):
    policy, workers, refitter = session["policy"], session["workers"], session["refitter"]
    port = refitter.side_group()["port"]
    key = "refit-test/batch"
    session["dataplane"].put_tensors(key, synthetic_batch(session["spec"], 8, seed=1))
    policy.logprobs_by_key(session["dataplane"].handle, key, "refit-test/lp")
    policy.logprobs_by_key(session["dataplane"].handle, key, "refit-test/lp-again")
    rank0 = policy.workers[0]
    assert ray.get(rank0.dataplane_clients.remote()) == 1  # one client per data plane, reused

    ray.get(workers[0].shutdown.remote(), timeout=60)  # in-actor engine: the actor lives on
    assert ray.get(workers[0].side_groups.remote()) == [[]]
    assert settles_to(port, 1 + 2) == 1 + 2
    ray.get(workers[1].shutdown.remote(), timeout=60)  # internal process: closed, then stopped
    assert settles_to(port, 1 + 1) == 1 + 1
    ray.get(rank0.shutdown.remote(), timeout=60)  # policy rank 0: the actor lives until PolicyGroup kills it
    assert ray.get(rank0.side_groups.remote()) == []
    assert ray.get(rank0.dataplane_clients.remote()) == 0
    assert settles_to(port, 1) == 1  # only the serving store's own connection is left

    refitter.close()  # last: stop serving
    refitter.close()  # idempotent
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
