"""The batch paths of capture (one store operation per turn / batch / attempt)
against their one-by-one forms, on real SQLite stores: same results, same rows,
failures isolated per call, batches that cannot begin fail closed."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from harness.capture.admission import AdmissionRequest, CaptureAdmitter
from harness.capture.finalize import (
    Placeholder,
    Sample,
    finalize_from_ledger,
    finalize_group,
)
from harness.capture.ledger import CaptureLedger, LedgerError
from harness.capture.receipt import build_receipt, build_receipts
from harness.capture.sink import CaptureBeginError, CaptureSink
from harness.dataplane.staging_db import StagingDB

EOS = 2


def _stores(path):
    return CaptureLedger(path / "ledger.sqlite"), StagingDB(path / "dataplane.sqlite")


def _render(turns: list[list[int]], gen: bool) -> list[int]:
    out: list[int] = []
    for i, content in enumerate(turns):
        out += [1, 5 if i % 2 == 0 else 6, 3, *content, EOS, 3]
    return out + ([1, 6, 3] if gen else [])


def _scenario(path, batched: bool):
    """Three turns of six rollouts; turn by turn every call is admitted (batched
    or one by one), begun, generated and finished. Rollout r1's first stage is
    injected to fail (its continuation is an unresolved parent), rollout r4's
    staged row is tampered before turn 2 (its continuation fails to fetch)."""
    ledger, dp = _stores(path)
    sink = CaptureSink(dp, CaptureLedger(path / "ledger.sqlite"))
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    rng = np.random.default_rng(7)
    rids = [f"r{i}" for i in range(6)]
    turns = {r: [[20 + i]] for i, r in enumerate(rids)}
    parent: dict[str, str | None] = dict.fromkeys(rids)
    log = []
    for t in range(3):
        cid = f"c{t}"
        reqs = [AdmissionRequest.root(r, cid, _render(turns[r], True)) if parent[r] is None else
                AdmissionRequest.continuation(r, cid, parent[r], _render(turns[r][:-1], False),
                                              _render(turns[r], True)) for r in rids]
        if batched:
            results = admitter.admit_many(reqs)
        else:
            results = [admitter.admit_root(q.rollout_id, q.model_call_id, q.prompt_ids) if q.parent_call_id is None
                       else admitter.admit_continuation(q.rollout_id, q.model_call_id, q.parent_call_id,
                                                        q.template_prefix_token_ids, q.template_token_ids)
                       for q in reqs]
        log.append(results)
        ok = [(r, res) for r, res in zip(rids, results) if res.ok]
        items = [(res.request_capture(), res.prompt_ids) for _, res in ok]
        handles = (sink.begin_requests(items, weight_version=t) if batched else
                   [sink.begin_request(a, p, weight_version=t) for a, p in items])
        finished = []
        for (r, _res), h in zip(ok, handles):
            out = [int(x) for x in rng.integers(10, 60, 3)] + [EOS]
            lp = [-0.5, -0.25, -0.125, -1.0] if not (r == "r1" and t == 0) else [-0.5, float("nan"), -0.1, -0.1]
            finished.append((h, out, lp, t))
            turns[r] += [out[:-1], [30 + t]]
            parent[r] = f"c{t}"
        coords = sink.finish_requests(finished)
        log.append(coords)
        if t == 0:  # tamper r4's staged row: its continuation cannot resolve the prefix
            raw = sqlite3.connect(path / "dataplane.sqlite")
            raw.execute("UPDATE rows SET digest = 'x' WHERE key = 'r4/c0'")
            raw.commit()
            raw.close()
    rows = {r: (ledger.manifest(r), ledger.admitted(r)) for r in rids}
    cache = admitter.prefix_cache
    out = log, rows, (cache.hits, cache.misses, cache.rows_fetched), admitter.failures, sink.stats()
    sink.close(); ledger.close(); dp.close()
    return out


def test_admit_many_and_begin_requests_equal_the_one_by_one_path(tmp_path):
    (tmp_path / "b").mkdir(); (tmp_path / "s").mkdir()
    batched, single = _scenario(tmp_path / "b", True), _scenario(tmp_path / "s", False)
    assert batched == single
    log, rows = batched[0], batched[1]
    assert [r.failure_reason for r in log[2]] == [None, "unresolved_parent:parent_failed", None, None,
                                                  "unresolved_parent:fetch_failed:DigestMismatch", None]
    assert rows["r4"][0][-1].failure_reason == "unresolved_parent:fetch_failed:DigestMismatch"
    assert [a.admission_seq for a in rows["r0"][1]] == [1, 7, 11]  # numbered in batch order, turn by turn


def test_admit_many_refuses_a_readmission_and_writes_no_admission(tmp_path):
    ledger, dp = _stores(tmp_path)
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    admitter.admit_root("a", "c0", [1, 2])
    batch = [AdmissionRequest.root("b", "c0", [1]), AdmissionRequest.root("a", "c0", [1])]
    with pytest.raises(LedgerError, match="a/c0 was already admitted"):
        admitter.admit_many(batch)
    assert ledger.admitted("b") == []
    with pytest.raises(ValueError, match="x/c1: a continuation needs"):
        AdmissionRequest("x", "c1", parent_call_id="c0")
    assert admitter.admit_many([]) == []
    ledger.close(); dp.close()


def test_begin_requests_is_all_or_nothing_and_names_the_request(tmp_path):
    ledger, dp = _stores(tmp_path)
    sink = CaptureSink(dp, CaptureLedger(tmp_path / "ledger.sqlite"))
    other = sink.begin_requests([({"rollout_id": "o", "model_call_id": "c0", "mode": "text"}, [1, 2])])
    batch = [({"rollout_id": f"r{i}", "model_call_id": "c0", "mode": "text"}, [1, 2]) for i in range(4)]
    batch[2] = ({"rollout_id": "r2", "model_call_id": "c0", "mode": "text", "prev_len": 3}, [1, 2])
    with pytest.raises(CaptureBeginError, match=r"item 2 \(r2/c0\).*prev_len") as info:
        sink.begin_requests(batch)
    assert info.value.index == 2 and type(info.value.__cause__).__name__ == "CaptureValidationError"
    assert sink.in_flight() == ["o/c0"]  # nothing of the failed batch stays in flight
    assert [ledger.get(f"r{i}", "c0").failure_reason for i in (0, 1, 3)] == ["aborted:begin_failed"] * 3
    assert ledger.get("r2", "c0").failure_reason.startswith("invalid_admission:CaptureAdmission.prev_len")
    # a call in flight elsewhere is named, and left alone
    with pytest.raises(CaptureBeginError, match=r"item 1 \(o/c0\).*already in flight"):
        sink.begin_requests([({"rollout_id": "n", "model_call_id": "c0", "mode": "text"}, [1]),
                             ({"rollout_id": "o", "model_call_id": "c0", "mode": "text"}, [1])])
    assert ledger.get("o", "c0") is None and ledger.get("n", "c0").failure_reason == "aborted:begin_failed"
    assert sink.finish_requests([(other[0], [7, EOS], [-0.5, -0.5], 0)])[0]["disposition"] == "staged"
    # twice in one batch: the second is at fault
    with pytest.raises(CaptureBeginError, match=r"item 1 \(d/c0\)"):
        sink.begin_requests([({"rollout_id": "d", "model_call_id": "c0", "mode": "text"}, [1])] * 2)
    assert sink.in_flight() == []
    # the single form raises the underlying error, as before
    with pytest.raises(ValueError, match="parent_call_id"):
        sink.begin_request({"rollout_id": "z", "model_call_id": "c0", "mode": "text", "parent_call_id": "x"}, [1])
    sink.close(); ledger.close(); dp.close()


def test_begin_requests_ledger_failure_begins_nothing(tmp_path):
    ledger, dp = _stores(tmp_path)
    sink = CaptureSink(dp, CaptureLedger(tmp_path / "ledger.sqlite"))
    blocker = sqlite3.connect(tmp_path / "ledger.sqlite", timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # the ledger cannot be read or written
    for conn in (sink.ledger._db, sink.ledger._fast):
        conn.execute("PRAGMA busy_timeout=50")
    with pytest.raises(CaptureBeginError, match="a batch of 2") as info:
        sink.begin_requests([({"rollout_id": f"r{i}", "model_call_id": "c0", "mode": "text"}, [1]) for i in range(2)])
    assert info.value.index is None and isinstance(info.value.__cause__, sqlite3.OperationalError)
    blocker.rollback(); blocker.close()
    assert sink.in_flight() == []
    sink.close(); ledger.close(); dp.close()


def test_build_receipts_and_batched_finalize_equal_the_single_forms(tmp_path):
    ledger, dp = _stores(tmp_path)
    sink = CaptureSink(dp, CaptureLedger(tmp_path / "ledger.sqlite"))
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)

    def call(rid, cid, parent=None, fail=False):
        res = (admitter.admit_root(rid, cid, [1, 5, 3]) if parent is None else
               admitter.admit_continuation(rid, cid, parent, [EOS], [EOS, 9]))
        h = sink.begin_request(res.request_capture(), res.prompt_ids)
        sink.finish_request(h, [40, EOS], [-0.1, float("nan") if fail else -0.2], 0)

    call("ok", "c0"); call("ok", "c1", "c0")
    call("retry", "c0"); call("retry", "c1", "c0"); call("retry", "c2", "c0")   # heuristic: c2
    call("failed", "c0", fail=True)
    call("open", "c0"); admitter.admit_continuation("open", "c1", "c0", [EOS], [EOS, 9])  # incomplete
    items = [("ok", 1.0, "c1"), ("retry", 0.5, None), ("failed", 0.0, None), ("open", 0.0, "c0"),
             ("never", 0.0, None), ("ok", 2.0, None)]
    batch = build_receipts(items, ledger)
    assert batch == [build_receipt(r, ledger, reward=w, declared_terminal=d) for r, w, d in items]
    assert [r.failure_reason for r in batch] == [None, None, "call_failed:c0:nonfinite_logprobs",
                                                 "incomplete_call:c1", "no_calls", None]
    # forge one receipt of the group: only it is masked, by the batched ledger cross-check
    d = batch[5].to_dict()
    d["manifest"][0]["chain_hash"] = "0" * 64
    forged = type(batch[5]).from_dict(d)
    samples, metrics = finalize_group([*batch[:5], forged], dp, ledger)
    assert [type(s) for s in samples] == [Sample, Sample, Placeholder, Placeholder, Placeholder, Placeholder]
    assert samples[5].reason == "receipt_disagrees_with_ledger:ok/c0"
    assert samples[0].calls == ["c0", "c1"] and samples[1].calls == ["c0", "c2"]
    assert metrics["finalize/masked_count"] == 4.0
    sink.close(); ledger.close(); dp.close()


def test_ledger_batch_reads_equal_single_reads_across_chunks(tmp_path):
    ledger, _ = _stores(tmp_path)
    from harness.capture.records import CallRecord, CaptureAdmission

    n = 950  # more than two chunks of pairs
    seqs = ledger.admit_many([CaptureAdmission(rollout_id=f"r{i % 300}", model_call_id=f"c{i // 300}", mode="text")
                              for i in range(n)])
    assert seqs == list(range(1, n + 1))
    ledger.record_many([CallRecord(f"r{i % 300}", f"c{i // 300}", "failed", admission_seq=i + 1,
                                   failure_reason=f"x{i}") for i in range(0, n, 3)])
    calls = [(f"r{i % 300}", f"c{i // 300}") for i in range(n)] + [("nope", "c0"), ("r0", "c0")]
    assert ledger.get_many(calls) == [ledger.get(*c) for c in calls]
    assert ledger.admission_seqs(calls) == [ledger.admission_seq(*c) for c in calls]
    rids = [f"r{i}" for i in range(300)] + ["nope"]
    assert ledger.manifests(rids) == {r: ledger.manifest(r) for r in rids}
    assert ledger.admitted_call_ids(rids) == {r: [a.model_call_id for a in ledger.admitted(r)] for r in rids}
    assert ledger.get_many([]) == [] and ledger.manifests([]) == {}
    ledger.close()


def test_normal_ledger_outcomes_survive_a_killed_engine_owner(tmp_path):
    """The sink's default ledger commit (synchronous=NORMAL) after the fsynced
    stage: a SIGKILL right after finish_requests loses neither the rows nor the
    outcomes (only an OS crash could drop the newest NORMAL commits)."""
    import signal
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import os, signal, sys
        from harness.capture.sink import CaptureSink
        sink = CaptureSink.from_config({{"ledger_path": {str(tmp_path / "ledger.sqlite")!r},
                                         "dataplane_path": {str(tmp_path / "dataplane.sqlite")!r}}})
        assert sink._sync_outcomes is False
        hs = sink.begin_requests([({{"rollout_id": f"r{{i}}", "model_call_id": "c0", "mode": "text"}}, [1, 5, 3])
                                  for i in range(3)], weight_version=0)
        coords = sink.finish_requests([(h, [40 + i, 2], [-0.5, -0.25], 0) for i, h in enumerate(hs)])
        assert all(c["disposition"] == "staged" for c in coords), coords
        sys.stdout.write("committed\\n"); sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "committed\n", proc.stderr
    ledger, dp = _stores(tmp_path)
    receipts, samples, metrics = finalize_from_ledger([(f"r{i}", 1.0, "c0") for i in range(3)], ledger, dp)
    assert metrics["finalize/masked_count"] == 0.0
    assert [s.token_ids for s in samples] == [[1, 5, 3, 40 + i, EOS] for i in range(3)]
    assert (receipts, samples) == (build_receipts([(f"r{i}", 1.0, "c0") for i in range(3)], ledger),
                                   finalize_group(receipts, dp, ledger)[0])
    with pytest.raises(ValueError, match="ledger_sync must be 'normal' or 'full'"):
        CaptureSink(dp, ledger, ledger_sync="fsync")
    ledger.close(); dp.close()
