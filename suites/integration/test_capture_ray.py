"""Capture across processes: a named data-plane Ray actor, a `CaptureSink`
built from plain config inside another Ray actor (the engine owner's seat),
admission and finalisation on the driver."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

EOS = 2


@pytest.fixture(scope="module")
def ray_session():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, namespace="capture_test")
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
class EngineOwner:
    """Stands in for E's RolloutWorker: only the capture calls are exercised."""

    def __init__(self, cfg):
        import torch

        torch.set_num_threads(1)
        from harness.capture.sink import CaptureSink

        self.sink = CaptureSink.from_config(cfg)

    def generate(self, admission, prompt_ids, output_ids, logprobs, version):
        import torch

        h = self.sink.begin_request(admission, prompt_ids, weight_version=version)
        return self.sink.finish_request(h, output_ids, torch.tensor(logprobs), version)

    def generate_batch(self, batch, version):
        """Begin every request, then finish them all with one group commit."""
        handles = [self.sink.begin_request(adm, prompt, weight_version=version) for adm, prompt, _, _ in batch]
        return self.sink.finish_requests([(h, out, lp, version) for h, (_, _, out, lp) in zip(handles, batch)])

    def stats(self):
        return self.sink.stats()

    def stages_locally(self):
        """Whether the sink's data-plane client writes through its own connection."""
        return self.sink.dataplane._writer() is not None

    def client_reads(self, client, key):
        """A pickled DataPlaneClient, used inside another actor: (row, reads served locally?)."""
        return client.fetch(key), client._rows() is not None


def test_capture_through_ray_actors(ray_session, tmp_path):
    from harness.capture.admission import CaptureAdmitter
    from harness.capture.finalize import Sample, finalize_group
    from harness.capture.ledger import CaptureLedger
    from harness.capture.receipt import build_receipt
    from harness.dataplane.actor import DataPlaneClient, start_dataplane_actor

    handle = start_dataplane_actor("dataplane", str(tmp_path / "dataplane.sqlite"))
    with pytest.raises(ValueError, match="already serves"):
        start_dataplane_actor("dataplane", str(tmp_path / "other.sqlite"))
    cfg = {"ledger_path": str(tmp_path / "ledger.sqlite"), "dataplane_actor": "dataplane",
           "dataplane_namespace": "capture_test", "fail_stage_rate": 0.0, "seed": 0}
    engine = EngineOwner.remote(cfg)
    client = DataPlaneClient("dataplane")
    ledger = CaptureLedger(cfg["ledger_path"])
    admitter = CaptureAdmitter(ledger, client, eos_token_id=EOS)

    outputs = {}
    for r in range(3):
        rid = f"r{r}"
        res = admitter.admit_root(rid, "c0", [1, 10 + r, 3])
        out0, lp0 = [40 + r, EOS], [-0.5, -0.25]
        c0 = ray.get(engine.generate.remote(res.request_capture(), res.prompt_ids, out0, lp0, 0))
        assert c0["disposition"] == "staged"
        res = admitter.admit_continuation(rid, "c1", "c0", [1, 10 + r, 3, 41, EOS], [1, 10 + r, 3, 41, EOS, 7, EOS, 6])
        assert res.ok and res.prompt_ids == [1, 10 + r, 3, 40 + r, EOS, 7, EOS, 6]
        out1, lp1 = [50, 51], [-1.5, -0.75]
        c1 = ray.get(engine.generate.remote(res.request_capture(), res.prompt_ids, out1, lp1, 1))
        assert c1["disposition"] == "staged" and c1["admission_epoch"] == 1
        outputs[rid] = res.prompt_ids + out1

    receipts = [build_receipt(f"r{r}", ledger, reward=float(r)) for r in range(3)]
    samples, metrics = finalize_group(receipts, client, ledger)
    assert metrics["finalize/masked_count"] == 0.0
    for s in samples:
        assert isinstance(s, Sample) and s.token_ids == outputs[s.rollout_id]
        assert s.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
        assert s.generation_logprobs == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, 0.0, -1.5, -0.75]
    assert client.keys("r1/") == ["r1/c0", "r1/c1"]
    client.snapshot(str(tmp_path / "ckpt.sqlite"))
    assert (tmp_path / "ckpt.sqlite").stat().st_size > 0
    assert ray.get(engine.stats.remote())["capture/staged"] == 6
    ledger.close()
    ray.kill(engine)
    ray.kill(handle)


def test_group_commit_through_the_actor_and_local_reads(ray_session, tmp_path):
    import pickle

    from harness.capture.admission import CaptureAdmitter
    from harness.capture.finalize import Placeholder, Sample, finalize_group
    from harness.capture.ledger import CaptureLedger
    from harness.capture.receipt import build_receipt
    from harness.dataplane.actor import DataPlaneClient, start_dataplane_actor
    from harness.dataplane.staging_db import StagingConflict

    handle = start_dataplane_actor("dataplane-batch", str(tmp_path / "dataplane.sqlite"))
    client = DataPlaneClient(handle)
    # stage_many through the actor: per-row outcomes come back, in order, errors as values
    out = client.stage_many([("x/a", {"v": 1}), ("x/b", {"v": float("nan")}), ("x/a", {"v": 2})])
    assert isinstance(out[0], str) and isinstance(out[1], ValueError) and isinstance(out[2], StagingConflict)
    # reads: locally on this node, the same answers as the actor gives
    remote = DataPlaneClient(handle, local_reads=False)
    assert client.fetch("x/a") == remote.fetch("x/a") == {"v": 1} and client._rows() is not None
    assert remote._rows() is None and client.keys("x/") == remote.keys("x/") == ["x/a"]
    assert client.digest("x/a") == remote.digest("x/a") == out[0] and not client.has("x/b")
    clone = pickle.loads(pickle.dumps(client))  # travels as the handle; opens its own reader
    assert clone.fetch("x/a") == {"v": 1}

    cfg = {"ledger_path": str(tmp_path / "ledger.sqlite"), "dataplane_actor": "dataplane-batch",
           "dataplane_namespace": "capture_test", "fail_stage_rate": 0.0, "seed": 0}
    engine = EngineOwner.remote(cfg)
    assert ray.get(engine.client_reads.remote(client, "x/a")) == ({"v": 1}, True)
    ledger = CaptureLedger(cfg["ledger_path"])
    admitter = CaptureAdmitter(ledger, client, eos_token_id=EOS)
    client.stage("r2/c0", {"taken": True})  # r2's stage will conflict
    batch = []
    for r in range(4):
        res = admitter.admit_root(f"r{r}", "c0", [1, 10 + r, 3])
        lp = [-0.5, float("inf")] if r == 1 else [-0.5, -0.25]
        batch.append((res.request_capture(), res.prompt_ids, [40 + r, EOS], lp))
    coords = ray.get(engine.generate_batch.remote(batch, 0))
    assert [c["failure_reason"] for c in coords] == [None, "nonfinite_logprobs", "stage_failed:StagingConflict", None]
    receipts = [build_receipt(f"r{r}", ledger, reward=1.0) for r in range(4)]
    samples, metrics = finalize_group(receipts, client, ledger)
    assert [type(s) for s in samples] == [Sample, Placeholder, Placeholder, Sample]
    assert samples[3].token_ids == [1, 13, 3, 43, EOS] and metrics["finalize/masked_count"] == 2.0
    ledger.close()
    client.close()
    ray.kill(engine)
    ray.kill(handle)


def test_local_writes_on_the_actor_node_equal_the_actor_path(ray_session, tmp_path):
    import sqlite3

    from harness.dataplane.actor import DataPlaneClient, start_dataplane_actor
    from harness.dataplane.staging_db import StagingConflict

    handle = start_dataplane_actor("dataplane-local-writes", str(tmp_path / "dataplane.sqlite"))
    local = DataPlaneClient(handle, local_writes=None)
    remote = DataPlaneClient(handle, local_reads=False)  # writes (default) and reads through the actor
    got = local.stage_many([("l/a", {"v": [1, 2]}), ("l/b", {"v": float("inf")})])
    assert local._writer() is not None and remote._rows() is None and remote._writer() is None
    assert isinstance(got[1], ValueError) and got[0] == remote.digest("l/a")
    assert remote.fetch("l/a") == {"v": [1, 2]}  # committed: the actor's own connection sees it
    # one file, one set of rules whichever connection writes
    assert isinstance(remote.stage_many([("l/a", {"v": [9]})])[0], StagingConflict)
    assert isinstance(local.stage_many([("r/a", {"v": 0})])[0], str)
    assert isinstance(local.stage_many([("r/a", {"v": 1})])[0], StagingConflict)
    assert remote.stage("r/a", {"v": 0}) == local.stage("r/a", {"v": 0})
    # durable on return: a fresh connection (another process's view) sees the rows
    raw = sqlite3.connect(tmp_path / "dataplane.sqlite")
    assert sorted(k for (k,) in raw.execute("SELECT key FROM rows")) == ["l/a", "r/a"]
    raw.close()
    with pytest.raises(ValueError, match="unknown key 'dataplane_local_write'"):
        from harness.capture.sink import CaptureSink

        CaptureSink.from_config({"ledger_path": str(tmp_path / "l.sqlite"), "dataplane_actor": "x",
                                 "dataplane_local_write": True})
    local.close()
    assert local._local is None
    ray.get(handle.close.remote())
    ray.kill(handle)


def test_session_stop_closes_the_driver_connection(ray_session, tmp_path):
    """Teardown of the capture half of a real `Session` (no engines, no policy):
    the driver's local read connection is closed before the actor's, so no
    WAL file outlives the run."""
    from types import SimpleNamespace

    from harness.envs.tokenizer import load_tokenizer
    from harness.runner.session import Session
    from harness.spec.typed import as_workload

    spec = {"seed": 0, "capture": {"enabled": True, "fail_stage_rate": 0.0}, "grpo": {"trainer": "grpo"}}
    # the parts of a RunPlan this half of a Session reads (a partial spec: no layout to plan)
    part = SimpleNamespace(workload=as_workload(spec), topology=None, ray_address=None)
    session = Session(part, tmp_path, {}, say=lambda _msg: None)
    session.tokenizer = load_tokenizer()
    admitter, _ledger, client = session._start_capture()
    res = admitter.admit_root("r", "c0", [1, 2, 3])
    client.stage("r/c0", {"v": 1})
    assert client.fetch("r/c0") == {"v": 1} and client._rows() is not None and res.ok
    assert (tmp_path / "dataplane.sqlite-wal").exists()
    session._stop()
    assert client._local is None
    assert not (tmp_path / "dataplane.sqlite-wal").exists()
    assert not (tmp_path / "ledger.sqlite-wal").exists()


def test_two_engine_owners_stage_concurrently_through_local_connections(ray_session, tmp_path):
    """Two engine owners on the actor's node group-commit at the same time, each
    through its own connection to the data-plane file: SQLite serialises the
    writers, every call commits, every rollout finalises."""
    from harness.capture.admission import AdmissionRequest, CaptureAdmitter
    from harness.capture.finalize import Sample, finalize_from_ledger
    from harness.capture.ledger import CaptureLedger
    from harness.dataplane.actor import DataPlaneClient, start_dataplane_actor

    handle = start_dataplane_actor("dataplane-two-owners", str(tmp_path / "dataplane.sqlite"))
    client = DataPlaneClient(handle)
    cfg = {"ledger_path": str(tmp_path / "ledger.sqlite"), "dataplane_actor": "dataplane-two-owners",
           "dataplane_namespace": "capture_test"}
    owners = [EngineOwner.remote(cfg), EngineOwner.remote(cfg)]
    ledger = CaptureLedger(cfg["ledger_path"])
    admitter = CaptureAdmitter(ledger, client, eos_token_id=EOS)
    rids = [f"e{e}b{b}r{r}" for e in range(2) for b in range(3) for r in range(8)]
    results = admitter.admit_many([AdmissionRequest.root(rid, "c0", [1, 7, 3]) for rid in rids])
    refs = []
    for e, owner in enumerate(owners):
        for b in range(3):
            batch = [(res.request_capture(), res.prompt_ids, [40 + r, EOS], [-0.5, -0.25])
                     for r, res in enumerate(results[(e * 3 + b) * 8:(e * 3 + b + 1) * 8])]
            refs.append(owner.generate_batch.remote(batch, 0))
    coords = [c for batch in ray.get(refs) for c in batch]
    assert ray.get([o.stages_locally.remote() for o in owners]) == [True, True]
    assert len(coords) == 48 and all(c["disposition"] == "staged" for c in coords)
    _, samples, metrics = finalize_from_ledger([(rid, 1.0, "c0") for rid in rids], ledger, client)
    assert metrics["finalize/masked_count"] == 0.0 and all(isinstance(s, Sample) for s in samples)
    assert [s.token_ids[3] for s in samples] == [40 + r for _e in range(2) for _b in range(3) for r in range(8)]
    ledger.close()
    client.close()
    for owner in owners:
        ray.kill(owner)
    ray.kill(handle)
