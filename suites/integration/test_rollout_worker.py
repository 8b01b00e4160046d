"""RolloutWorker as real Ray actors: in-actor TP=1 sync, internal-process TP=1/TP=2 async,
refit over ZMQ and over a side-group broadcast, profiler placement, clean shutdown."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from harness.model.config import ModelConfig  # noqa: E402
from harness.model.qwen3_moe import build_reference_model  # noqa: E402
from harness.parallel.rendezvous import RendezvousServer  # noqa: E402
from harness.refit.broadcast import SideGroupSlot, broadcast_weights  # noqa: E402
from harness.refit.engine_offsets import derive_engine_gpu_offsets  # noqa: E402
from harness.refit.zmq_stream import send_weights_zmq  # noqa: E402
from harness.rollout.worker import rollout_worker_actor  # noqa: E402
from harness.spec.typed import Workload, as_workload  # noqa: E402
from suites.tcp_connections import established, settles_to  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = dict(layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, experts=4, top_k=2,
             moe_intermediate=16, vocab=64, max_position=96)
PROFILER = "harness.profiler.trace.TraceRolloutProfiler"


def _spec(tp: int, is_async: bool) -> Workload:
    """The typed workload a worker gets from the run plan (defaults filled in)."""
    return as_workload({
        "seed": 5,
        "model": dict(MODEL),
        "rollout": {"backend": "native", "tp": tp, "pp": 1, "ep": 1, "async": is_async, "max_batch_size": 3,
                    "worker_cls": None, "refit": {"transport": "auto", "buffer_size_bytes": 8192}},
        "platform": {"device": "cpu"},
    })


def _requests(n: int = 5) -> list[dict]:
    return [dict(request_id=f"q{i}", prompt_ids=[(5 * i + j) % 64 for j in range(3 + i)], max_new_tokens=6,
                 seed=40 + i, temperature=1.0, top_p=0.9 if i % 2 else 1.0) for i in range(n)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> set[int]:
    kids: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return kids
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids.update(int(x) for x in f.read().split())
        except FileNotFoundError:
            continue
    return kids


def _descendants(pid: int) -> set[int]:
    """Children and their children: engine processes are forked by the actor's fork server."""
    out, stack = set(), [pid]
    while stack:
        for child in _children(stack.pop()) - out:
            out.add(child)
            stack.append(child)
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    run_dir = tmp_path_factory.mktemp("run")
    env = {"NRL_ROLLOUT_PROFILER_CLASS": PROFILER, "HARNESS_TRACE_DIR": str(run_dir), "HARNESS_RUN_ID": "t"}
    actor = rollout_worker_actor()
    workers = {
        "tp1_sync": actor.remote(_spec(1, False), 0, 0, str(run_dir), env),
        "tp2_async": actor.remote(_spec(2, True), 1, 1, str(run_dir), env),
        "tp1_async": actor.remote(_spec(1, True), 2, 3, str(run_dir), env),
    }
    info = {name: ray.get(w.ready.remote(), timeout=300) for name, w in workers.items()}
    yield {"workers": workers, "info": info, "run_dir": run_dir}
    for w in workers.values():
        try:
            ray.get(w.shutdown.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - best-effort teardown
            pass
    ray.shutdown()


def test_placement_of_engines(cluster):
    info = cluster["info"]
    assert info["tp1_sync"]["engine_pids"] == []
    assert len(info["tp2_async"]["engine_pids"]) == 2 and len(info["tp1_async"]["engine_pids"]) == 1
    for name in ("tp2_async", "tp1_async"):
        assert set(info[name]["engine_pids"]) <= _descendants(info[name]["actor_pid"])


def test_async_concurrent_requests_equal_sync_results(cluster):
    w = cluster["workers"]
    requests = _requests()
    sync_tp1 = ray.get(w["tp1_sync"].generate.remote(requests))
    async_tp1 = ray.get([w["tp1_async"].generate_one.remote(r) for r in requests])
    assert async_tp1 == sync_tp1  # same math in an internal process, batched differently
    sync_tp2 = ray.get(w["tp2_async"].generate.remote(requests))
    async_tp2 = ray.get([w["tp2_async"].generate_one.remote(r) for r in reversed(requests)])[::-1]
    assert async_tp2 == sync_tp2
    again = ray.get(w["tp2_async"].generate.remote(requests[2:]))
    assert again == sync_tp2[2:]
    for a, b in zip(sync_tp1, sync_tp2):  # TP sharding changes float summation order only
        n = min(len(a["logprobs"]), len(b["logprobs"]))
        if a["output_ids"][:n] == b["output_ids"][:n]:
            assert torch.allclose(torch.tensor(a["logprobs"][:n]), torch.tensor(b["logprobs"][:n]), atol=1e-4)


def _new_weights(seed: int) -> dict[str, torch.Tensor]:
    model = build_reference_model(ModelConfig(**MODEL), seed=seed)
    return {n: t.detach() for n, t in model.state_dict().items()}


def _assert_bit_equal(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


@pytest.mark.parametrize("name", ["tp1_sync", "tp2_async"])
def test_zmq_refit_is_bit_exact(cluster, name):
    worker = cluster["workers"][name]
    before = ray.get(worker.weight_version.remote())
    state = _new_weights(seed=100 + len(name))
    addresses = ray.get(worker.refit_addresses.remote())
    pending = worker.receive_weights.remote("zmq", timeout_ms=60_000)
    errors: list[BaseException] = []

    def send(address):
        try:
            send_weights_zmq(state.items(), address=address, buffer_size_bytes=8192, timeout_ms=60_000)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the test
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(a,)) for a in addresses]
    for t in threads:
        t.start()
    version = ray.get(pending, timeout=120)
    for t in threads:
        t.join(60)
    assert not errors
    assert version == before + 1 == ray.get(worker.weight_version.remote())
    _assert_bit_equal(ray.get(worker.get_weights.remote()), state)
    result = ray.get(worker.generate.remote(_requests(1)))[0]
    assert result["weight_version"] == version


@pytest.fixture(scope="module")
def side_store(cluster):
    """The refit driver's role: a store served (bound) here before any member hears of the port."""
    store = RendezvousServer()
    yield {"store": store, "base": established(store.port), "prefix": "test-rollout-worker"}
    store.close()


BROADCAST_REFITS = 3


def _side(side_store) -> dict:
    store = side_store["store"]
    return {"host": store.host, "port": store.port, "world_size": 1 + 3, "prefix": side_store["prefix"]}


def _broadcast_refit(w, side_store, sender: SideGroupSlot, seed: int):
    """One broadcast refit from ``sender`` (side-group rank 0) to tp1_sync (rank 1) and tp2_async (ranks 2, 3)."""
    targets = [w["tp1_sync"], w["tp2_async"]]
    offsets = derive_engine_gpu_offsets([1, 2])
    side = _side(side_store)
    state = _new_weights(seed=seed)
    before = ray.get([t.weight_version.remote() for t in targets])
    pending = [
        t.receive_weights.remote("broadcast", **side, rank_offset=1 + off, buffer_size_bytes=4096)
        for t, off in zip(targets, offsets)
    ]
    try:
        buckets = broadcast_weights(state.items(), sender.join(rank=0, **side), buffer_size_bytes=4096)
    finally:
        versions = ray.get(pending, timeout=120)
    return targets, state, before, versions, buckets


def test_broadcast_refits_reuse_one_side_group_per_rank_and_are_bit_exact(cluster, side_store):
    w = cluster["workers"]
    world = 1 + 3
    store = side_store["store"]
    sender = SideGroupSlot()
    try:
        for refit in range(BROADCAST_REFITS):
            targets, state, before, versions, buckets = _broadcast_refit(w, side_store, sender, seed=321 + refit)
            assert buckets > 1
            assert not torch.distributed.is_initialized()  # the side group left the default world alone
            assert versions == [b + 1 for b in before]
            for t in targets:
                _assert_bit_equal(ray.get(t.get_weights.remote()), state)
            # exactly one side group per engine rank, built by the first refit, reused since
            held = {name: ray.get(w[name].side_groups.remote()) for name in ("tp1_sync", "tp2_async")}
            assert [len(r) for r in held["tp1_sync"]] == [1] and [len(r) for r in held["tp2_async"]] == [1, 1]
            ranks = [r[0]["rank"] for name in ("tp1_sync", "tp2_async") for r in held[name]]
            assert ranks == [1, 2, 3]
            assert {r[0]["created"] for rs in held.values() for r in rs} == {1}
            assert {(r[0]["port"], r[0]["prefix"]) for rs in held.values() for r in rs} == {
                (store.port, side_store["prefix"])}
            assert sender.created == 1
            # one store connection per member (sender + 3 engine ranks), not one per refit
            assert settles_to(store.port, side_store["base"] + world) == side_store["base"] + world
        assert ray.get(w["tp1_async"].side_groups.remote()) == [[]]  # not a member
    finally:
        sender.close()
    assert settles_to(store.port, side_store["base"] + world - 1) == side_store["base"] + world - 1


def _events(path) -> list[str]:
    return [json.loads(line).get("event") for line in path.read_text().splitlines() if '"event"' in line]


def test_profiler_lifecycle_fans_out_to_every_engine_rank(cluster):
    w = cluster["workers"]
    for name in ("tp1_sync", "tp2_async"):
        ray.get(w[name].begin_rollout.remote("step1/attempt1"))
        ray.get(w[name].generate.remote(_requests(2)))
        ray.get(w[name].finish_rollout.remote())
        ray.get(w[name].begin_rollout.remote("step2/attempt1"))
        ray.get(w[name].abort_rollout.remote("grpo_rollout_error"))
    rollout_dir = cluster["run_dir"] / "artifacts" / "rollout"
    # outer profiler rank 0 (TP1 sync), internal ranks 1, 2 (TP2), 3 (TP1 async)
    assert sorted(p.name for p in rollout_dir.iterdir()) == [f"rank{r:05d}.trace.jsonl" for r in range(4)]
    for rank in (0, 1, 2):
        events = [e for e in _events(rollout_dir / f"rank{rank:05d}.trace.jsonl") if e]
        assert events == ["begin_engine_initialization", "end_engine_initialization", "begin_rollout",
                          "finish_rollout", "begin_rollout", "abort_rollout"], rank


def test_shutdown_closes_profilers_side_groups_and_leaves_no_children(cluster, side_store):
    info, w = cluster["info"], cluster["workers"]
    store = side_store["store"]
    if ray.get(w["tp1_sync"].side_groups.remote()) == [[]]:
        # run without the broadcast test before it (-k, --lf, another xdist worker): the engine
        # ranks join their side groups here, or the connection counts below would not hold
        sender = SideGroupSlot()
        try:
            _broadcast_refit(w, side_store, sender, seed=999)
        finally:
            sender.close()
    ray.get(w["tp1_sync"].shutdown.remote(), timeout=60)
    # the in-actor engine's actor is still alive: its side group was closed, not just dropped with a process
    assert ray.get(w["tp1_sync"].side_groups.remote()) == [[]]
    assert settles_to(store.port, side_store["base"] + 2) == side_store["base"] + 2  # tp2_async's 2 ranks
    for name in ("tp2_async", "tp1_async"):
        ray.get(w[name].shutdown.remote(), timeout=60)
    assert settles_to(store.port, side_store["base"]) == side_store["base"]  # no member connection left
    deadline = time.monotonic() + 10
    pids = [p for i in info.values() for p in i["engine_pids"]]
    assert pids, info  # the async workers' engine processes: with none, "none alive" proves nothing
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)
    for name in ("tp2_async", "tp1_async"):
        assert not (_descendants(info[name]["actor_pid"]) & set(info[name]["engine_pids"]))
    rollout_dir = cluster["run_dir"] / "artifacts" / "rollout"
    for rank in range(4):
        last = json.loads((rollout_dir / f"rank{rank:05d}.trace.jsonl").read_text().splitlines()[-1])
        assert last["type"] == "close", rank
    with pytest.raises(ray.exceptions.RayTaskError, match="shut down"):
        ray.get(w["tp2_async"].generate.remote(_requests(1)))


def test_capture_batch_that_cannot_begin_names_the_request_and_fails_closed(cluster, tmp_path):
    """A malformed admission in the middle of a sync batch: the error names the
    request, the batch's other calls get failure rows, nothing stays in flight."""
    from harness.capture.ledger import CaptureLedger
    from harness.capture.sink import CaptureBeginError

    cfg = {"ledger_path": str(tmp_path / "ledger.sqlite"), "dataplane_path": str(tmp_path / "dataplane.sqlite")}
    w = rollout_worker_actor().remote(_spec(1, False), 3, 6, str(cluster["run_dir"]), None, capture_config=cfg)
    requests = _requests(4)
    for i, r in enumerate(requests):
        r["capture"] = {"rollout_id": f"r{i}", "model_call_id": "c0", "mode": "text"}
    requests[2]["capture"] = {**requests[2]["capture"], "prev_len": 3}  # a text-mode root with a prefix
    with pytest.raises(CaptureBeginError, match=r"request 'q2' \(position 2 of the batch\).*prev_len"):
        ray.get(w.generate.remote(requests), timeout=300)
    ledger = CaptureLedger(cfg["ledger_path"])
    assert [ledger.get(f"r{i}", "c0").failure_reason for i in (0, 1, 3)] == ["aborted:begin_failed"] * 3
    assert ledger.get("r2", "c0").failure_reason.startswith("invalid_admission:")
    # no handle was left in flight: the same calls begin again (their outcomes stand: not captured)
    requests[2]["capture"] = {"rollout_id": "r2", "model_call_id": "c0", "mode": "text"}
    results = ray.get(w.generate.remote(requests), timeout=300)
    assert [r["capture"]["failure_reason"] for r in results] == ["duplicate_call_id"] * 4
    ledger.close()
    ray.get(w.shutdown.remote(), timeout=60)
    ray.kill(w)
