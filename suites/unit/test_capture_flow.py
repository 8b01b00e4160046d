"""End-to-end capture flow on real SQLite stores: admission -> sink -> receipt
-> finalisation, against an independent record of what the engine produced.

The "engine" is a seeded stand-in (numpy RNG) for the rollout worker: the
capture layer only sees token ids and logprobs, which is all it needs.
"""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from harness.capture.admission import CaptureAdmitter
from harness.capture.digests import unit_interval
from harness.capture.finalize import (
    Placeholder,
    Sample,
    finalize_group,
    finalize_rollout,
    rollout_summary,
)
from harness.capture.ledger import CaptureLedger, LedgerError
from harness.capture.receipt import build_receipt
from harness.capture.records import CaptureValidationError
from harness.capture.sink import CaptureSink, capture_config_from_spec
from harness.dataplane.staging_db import StagingDB
from harness.spec.typed import as_workload

EOS, IM_START, NL, THINK, ENDTHINK = 2, 1, 3, 8, 9
ROLE = {"system": 4, "user": 5, "assistant": 6, "tool": 7}


def render(messages, add_generation_prompt):
    """Qwen3-like: assistant turns before the last user turn lose their think block."""
    last_user = max((i for i, (r, _) in enumerate(messages) if r == "user"), default=-1)
    out = []
    for i, (role, content) in enumerate(messages):
        if role == "assistant" and i < last_user and THINK in content:
            content = content[: content.index(THINK)] + content[content.index(ENDTHINK) + 1:]
        out += [IM_START, ROLE[role], NL] + list(content) + [EOS, NL]
    return out + ([IM_START, ROLE["assistant"], NL] if add_generation_prompt else [])


class Engine:
    """Seeded stand-in for the engine; keeps an independent log of its outputs."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.log = {}

    def generate(self, rollout_id, prompt):
        n = int(self.rng.integers(1, 6))
        out = [THINK, *self.rng.integers(10, 60, n).tolist(), ENDTHINK, *self.rng.integers(10, 60, 2).tolist()]
        if self.rng.random() < 0.8:
            out.append(EOS)  # else: stopped on max_tokens
        lp = (-self.rng.random(len(out))).astype(np.float64)
        self.log.setdefault(rollout_id, []).append((list(prompt), out, lp))
        return out, lp


@pytest.fixture
def stores(tmp_path):
    cfg = {"ledger_path": str(tmp_path / "ledger.sqlite"), "dataplane_path": str(tmp_path / "dataplane.sqlite")}
    ledger, dp = CaptureLedger(cfg["ledger_path"]), StagingDB(cfg["dataplane_path"])
    yield cfg, ledger, dp
    ledger.close()
    dp.close()


def run_rollout(rid, turns, admitter, sink, engine, *, version=0, abort_at=None):
    messages = [("system", [11, 12]), ("user", [20 + turns])]
    prompt = render(messages, True)
    res = admitter.admit_root(rid, "c0", prompt)
    parent = None
    for t in range(turns):
        cid = f"c{t}"
        if t:
            messages.append(("tool" if t % 2 else "user", [30 + t, 31]))
            res = admitter.admit_continuation(rid, cid, parent, render(messages[:-1], False), render(messages, True))
            if not res.ok:
                return
        h = sink.begin_request(res.request_capture(), res.prompt_ids, weight_version=version)
        out, lp = engine.generate(rid, res.prompt_ids)
        if abort_at == t:
            sink.abort_request(h, "engine_shutdown")
            return
        coords = sink.finish_request(h, out, lp, version)
        assert "token_ids" not in str(coords) and set(coords) >= {"chain_hash", "disposition"}
        messages.append(("assistant", [x for x in out if x != EOS]))
        parent = cid


def expected_from_engine(calls):
    """Independent linearisation from the engine log: last prompt + output; trainable = outputs."""
    prompt, out, _ = calls[-1]
    ids = prompt + out
    mask, lps = [0] * len(ids), [0.0] * len(ids)
    for p, o, lp in calls:
        assert ids[: len(p)] == p  # every call's prompt is a prefix of the final sequence
        for j, (tok, x) in enumerate(zip(o, lp)):
            assert ids[len(p) + j] == tok
            mask[len(p) + j] = 1
            lps[len(p) + j] = float(np.float32(x))
    return ids, mask, lps


def test_multi_turn_samples_equal_the_engine_outputs(stores):
    cfg, ledger, dp = stores
    sink = CaptureSink.from_config(cfg)
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    engine = Engine(0)
    rids = [f"r{i}" for i in range(6)]
    for i, rid in enumerate(rids):
        run_rollout(rid, 1 + i % 4, admitter, sink, engine)
    receipts = [build_receipt(rid, ledger, reward=float(i)) for i, rid in enumerate(rids)]
    samples, metrics = finalize_group(receipts, dp, ledger)
    assert metrics == {"finalize/rollouts": 6.0, "finalize/masked_count": 0.0,
                       "finalize/heuristic_terminal_fraction": 1.0}
    for rid, s in zip(rids, samples):
        assert isinstance(s, Sample) and s.sample_mask == 1.0
        ids, mask, lps = expected_from_engine(engine.log[rid])
        assert (s.token_ids, s.loss_mask, s.generation_logprobs) == (ids, mask, lps)
        assert s.prompt_len == len(engine.log[rid][0][0])
    # 7 continuations; each resolves its parent's chain fetching only the parent's own row
    cache = admitter.prefix_cache
    assert (cache.misses, cache.rows_fetched) == (7, 7)
    summary = rollout_summary(receipts[3], samples[3])
    assert summary["masked"] is False and len(summary["calls"]) == 4 and "token_ids" not in summary
    sink.close()


def test_staging_failures_mask_exactly_the_affected_rollouts(stores):
    cfg, ledger, dp = stores
    rate, seed = 0.1, 1234
    sink = CaptureSink.from_config({**cfg, "fail_stage_rate": rate, "seed": seed})
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    engine = Engine(1)
    rids = [f"r{i}" for i in range(40)]
    for rid in rids:
        run_rollout(rid, 3, admitter, sink, engine)
    receipts = [build_receipt(rid, ledger, reward=1.0) for rid in rids]
    results, metrics = finalize_group(receipts, dp, ledger)

    def first_injected(rid):
        return next((t for t in range(3) if unit_interval(seed, f"{rid}/c{t}") < rate), None)

    affected = {rid for rid in rids if first_injected(rid) is not None}
    assert 0 < len(affected) < len(rids)  # the seeded subset is non-trivial
    assert sink.injected_failures == len(affected)
    assert metrics["finalize/masked_count"] == len(affected) == sum(r.masked for r in results)
    assert len(results) == len(rids)  # group size kept
    for rid, r in zip(rids, results):
        if rid in affected:
            assert isinstance(r, Placeholder) and r.sample_mask == 0.0 and r.token_ids == []
            assert r.reason.startswith("call_failed:c") and "stage_failed:InjectedStagingFailure" in r.reason
            # the failed call was never staged and never became a parent
            t = first_injected(rid)
            assert not dp.has(f"{rid}/c{t}")
            assert ledger.get(rid, f"c{t + 1}") is None or not ledger.get(rid, f"c{t + 1}").committed
        else:
            assert isinstance(r, Sample)


def test_unresolved_parent_is_a_failure_row_never_a_new_root(stores):
    cfg, ledger, dp = stores
    sink = CaptureSink.from_config(cfg)
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    res = admitter.admit_continuation("r", "c1", "c0", [EOS], [EOS, 5])
    assert not res.ok and res.failure_reason == "unresolved_parent:not_committed"
    row = ledger.get("r", "c1")
    assert row.status == "failed" and row.parent_call_id == "c0"
    # a failed parent is never resolved
    root = admitter.admit_root("q", "c0", [1, 2])
    h = sink.begin_request(root.request_capture(), root.prompt_ids)
    sink.abort_request(h, "timeout")
    res = admitter.admit_continuation("q", "c1", "c0", [1, 2, EOS], [1, 2, EOS, 4])
    assert res.failure_reason == "unresolved_parent:parent_failed"
    assert build_receipt("q", ledger, reward=1.0).capture_poisoned
    sink.close()


def test_sink_poisons_a_prompt_that_does_not_continue_the_parent(stores):
    cfg, ledger, dp = stores
    sink = CaptureSink.from_config(cfg)
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    root = admitter.admit_root("r", "c0", [1, 5, 3])
    sink.finish_request(sink.begin_request(root.request_capture(), root.prompt_ids), [40, EOS], [-0.1, -0.2], 0)
    good = admitter.admit_continuation("r", "c1", "c0", [1, 5, 3, 41, EOS], [1, 5, 3, 41, EOS, 9])
    assert good.ok and good.prompt_ids == [1, 5, 3, 40, EOS, 9]
    drifted = [1, 5, 3, 41, EOS, 9]  # what a naive re-render would send
    coords = sink.finish_request(sink.begin_request(good.request_capture(), drifted), [7], [-0.3], 0)
    assert coords["disposition"] == "capture_failed" and coords["failure_reason"] == "prefix_mismatch"
    assert coords["cum_len"] == coords["prev_len"] == 5
    receipt = build_receipt("r", ledger, reward=0.0)
    assert receipt.capture_poisoned and "prefix_mismatch" in receipt.failure_reason
    assert isinstance(finalize_rollout(receipt, dp, ledger), Placeholder)
    sink.close()


def test_tampered_staged_row_gives_a_placeholder(stores, tmp_path):
    cfg, ledger, dp = stores
    sink = CaptureSink.from_config(cfg)
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    run_rollout("r", 2, admitter, sink, Engine(2))
    receipt = build_receipt("r", ledger, reward=1.0)
    assert isinstance(finalize_rollout(receipt, dp, ledger), Sample)
    raw = sqlite3.connect(tmp_path / "dataplane.sqlite")
    raw.execute("UPDATE rows SET payload = CAST(replace(CAST(payload AS TEXT), '\"prev_len\":0', '\"prev_len\":1')"
                " AS BLOB) WHERE key='r/c0'")
    raw.commit()
    raw.close()
    out = finalize_rollout(receipt, dp, ledger)
    assert isinstance(out, Placeholder) and out.reason == "fetch_failed:DigestMismatch"
    sink.close()


def test_forged_receipt_chain_is_rejected(stores):
    cfg, ledger, dp = stores
    sink = CaptureSink.from_config(cfg)
    run_rollout("r", 2, CaptureAdmitter(ledger, dp, eos_token_id=EOS), sink, Engine(3))
    receipt = build_receipt("r", ledger, reward=1.0)
    d = receipt.to_dict()
    d["manifest"][1]["chain_hash"] = "0" * 64
    forged = type(receipt).from_dict(d)
    assert finalize_rollout(forged, dp).reason == "chain_hash_mismatch:r/c1"
    assert finalize_rollout(forged, dp, ledger).reason == "receipt_disagrees_with_ledger:r/c1"
    sink.close()


def _root(sink, rid, cid, prompt, out):
    h = sink.begin_request({"rollout_id": rid, "model_call_id": cid, "mode": "text"}, prompt)
    return sink.finish_request(h, out, [-0.5] * len(out), 0)


def test_terminal_selection_declared_heuristic_mask(stores):
    cfg, ledger, dp = stores
    sink = CaptureSink.from_config(cfg)
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)

    def call(rid, cid, parent=None):
        if parent is None:
            res = admitter.admit_root(rid, cid, [1, 5, 3])
        else:
            res = admitter.admit_continuation(rid, cid, parent, [EOS], [EOS, 9])
            assert res.ok, res.failure_reason
        sink.finish_request(sink.begin_request(res.request_capture(), res.prompt_ids), [40, EOS], [-0.1, -0.2], 0)

    # retry: c1 abandoned (leaf), c2 continues -> heuristic follows c2
    call("a", "c0"); call("a", "c1", "c0"); call("a", "c2", "c0"); call("a", "c3", "c2")
    ra = build_receipt("a", ledger, reward=1.0)
    assert (ra.terminal_model_call_id, ra.terminal_selection) == ("c3", "heuristic")
    assert "1 abandoned retries" in ra.terminal_attribution_reason
    # declared beats heuristic
    rd = build_receipt("a", ledger, reward=1.0, declared_terminal="c1")
    assert (rd.terminal_model_call_id, rd.terminal_selection) == ("c1", "declared")
    assert finalize_rollout(rd, dp, ledger).calls == ["c0", "c1"]
    # fork: both children continue -> mask
    call("f", "c0"); call("f", "c1", "c0"); call("f", "c2", "c0"); call("f", "c3", "c1"); call("f", "c4", "c2")
    rf = build_receipt("f", ledger, reward=1.0)
    assert rf.capture_poisoned and rf.failure_reason.startswith("ambiguous_terminal:fork at c0")
    assert isinstance(finalize_rollout(rf, dp, ledger), Placeholder)
    # declared terminal that does not exist -> poisoned
    assert build_receipt("a", ledger, reward=1.0, declared_terminal="zz").failure_reason == \
        "declared_terminal_not_committed:zz"
    # admitted but never finished -> incomplete -> poisoned
    res = admitter.admit_root("i", "c0", [1])
    sink.begin_request(res.request_capture(), res.prompt_ids)
    assert build_receipt("i", ledger, reward=0.0).failure_reason == "no_calls"
    call("j", "c0")
    admitter.admit_continuation("j", "c1", "c0", [EOS], [EOS, 9])
    assert build_receipt("j", ledger, reward=0.0).failure_reason == "incomplete_call:c1"
    sink.close()


def test_refit_span_keeps_admission_epoch_and_is_counted(stores):
    cfg, ledger, dp = stores
    sink = CaptureSink.from_config(cfg)
    c = sink.finish_request(sink.begin_request({"rollout_id": "r", "model_call_id": "c0", "mode": "text"}, [1, 2],
                                               weight_version=3), [5], [-0.1], weight_version=4)
    assert (c["admission_epoch"], c["weight_version"], sink.epoch_span_count) == (3, 4, 1)
    c = sink.finish_request(sink.begin_request({"rollout_id": "s", "model_call_id": "c0", "mode": "text"}, [1, 2],
                                               weight_version=4), [5], [-0.1], weight_version=4)
    assert sink.epoch_span_count == 1 and sink.stats()["capture/epoch_span_count"] == 1
    s = finalize_rollout(build_receipt("r", ledger, reward=0.0), dp, ledger)
    assert s.weight_epoch == 3
    sink.close()


def test_sink_errors_and_failure_paths(stores):
    cfg, ledger, _dp = stores
    sink = CaptureSink.from_config(cfg)
    with pytest.raises(KeyError, match="'r/zz' is not in flight"):
        sink.finish_request("r/zz", [1], [0.0], 0)
    with pytest.raises(CaptureValidationError, match="parent_call_id"):
        sink.begin_request({"rollout_id": "r", "model_call_id": "bad", "mode": "text", "parent_call_id": "x"}, [1])
    assert ledger.get("r", "bad").failure_reason.startswith("invalid_admission:")
    h = sink.begin_request({"rollout_id": "r", "model_call_id": "c0", "mode": "text"}, [1])
    with pytest.raises(ValueError, match="already in flight"):
        sink.begin_request({"rollout_id": "r", "model_call_id": "c0", "mode": "text"}, [1])
    c = sink.finish_request(h, [4, 5], [-0.1], 0)
    assert c["failure_reason"] == "logprobs_length_mismatch:1!=2"
    c = sink.finish_request(sink.begin_request({"rollout_id": "r", "model_call_id": "c0", "mode": "text"}, [1]),
                            [4], [-0.1], 0)
    assert c["failure_reason"] == "duplicate_call_id"
    with pytest.raises(LedgerError, match="already has outcome 'failed'"):
        ledger.record(ledger.get("r", "c0").__class__("r", "c0", "committed", prev_len=0, delta_len=1, cum_len=1,
                                                      digest="a", staging_key="r/c0", staging_chain=("r/c0",),
                                                      chain_hash="a", cumulative_hash="a"))
    for bad, match in [({}, "ledger_path"), ({"ledger_path": "x"}, "exactly one"),
                       ({**cfg, "nope": 1}, "unknown key 'nope'"), ({**cfg, "fail_stage_rate": 2}, "fail_stage_rate")]:
        with pytest.raises(ValueError, match=match):
            CaptureSink.from_config(bad)
    spec = as_workload({"seed": 7, "capture": {"enabled": True, "fail_stage_rate": 0.1}})
    assert capture_config_from_spec(spec, "/run") == {"ledger_path": "/run/ledger.sqlite", "fail_stage_rate": 0.1,
                                                       "seed": 7, "dataplane_path": "/run/dataplane.sqlite"}
    sink.close()


def test_ledger_snapshot_restore(stores, tmp_path):
    cfg, ledger, dp = stores
    sink = CaptureSink.from_config(cfg)
    run_rollout("r", 2, CaptureAdmitter(ledger, dp, eos_token_id=EOS), sink, Engine(4))
    ledger.snapshot(tmp_path / "ckpt" / "ledger.sqlite")
    dp.snapshot(tmp_path / "ckpt" / "dataplane.sqlite")
    run_rollout("s", 1, CaptureAdmitter(ledger, dp, eos_token_id=EOS), sink, Engine(5))
    l2 = CaptureLedger.restore(tmp_path / "ckpt" / "ledger.sqlite", tmp_path / "restored" / "ledger.sqlite")
    d2 = StagingDB.restore(tmp_path / "ckpt" / "dataplane.sqlite", tmp_path / "restored" / "dataplane.sqlite")
    assert l2.rollout_ids() == ["r"] and l2.manifest("r") == ledger.manifest("r")
    a = finalize_rollout(build_receipt("r", l2, reward=1.0), d2, l2)
    b = finalize_rollout(build_receipt("r", ledger, reward=1.0), dp, ledger)
    assert isinstance(a, Sample) and a == b
    l2.close(); d2.close(); sink.close()


# -- group commit (finish_requests / stage_many / record_many) ------------------------------------


def _roots(admitter, sink, rids, prompt=(1, 5, 3)):
    handles = []
    for rid in rids:
        res = admitter.admit_root(rid, "c0", list(prompt))
        handles.append(sink.begin_request(res.request_capture(), res.prompt_ids, weight_version=0))
    return handles


def test_finish_batch_isolates_each_failing_call(stores):
    cfg, ledger, dp = stores
    sink = CaptureSink.from_config(cfg)
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    # a committed parent for the drifted continuation below
    (h,) = _roots(admitter, sink, ["p"])
    assert sink.finish_request(h, [40, EOS], [-0.1, -0.2], 0)["disposition"] == "staged"
    cont = admitter.admit_continuation("p", "c1", "c0", [1, 5, 3, 40, EOS], [1, 5, 3, 40, EOS, 9])
    drifted = sink.begin_request(cont.request_capture(), [1, 5, 3, 41, EOS, 9], weight_version=0)  # poisoned at begin
    dp.stage("r3/c0", {"someone": "else"})  # r3's key is taken: its stage gets a real StagingConflict
    rids = [f"r{i}" for i in range(6)]
    hs = _roots(admitter, sink, rids)
    good_lp = [-0.5, -0.25, -0.125]
    finished = [
        (hs[0], [11, 12, EOS], good_lp, 0),
        (hs[1], [11, 12, EOS], [-0.5, float("nan"), -0.1], 0),
        (hs[2], [11, 12, EOS], [-0.5], 0),
        (hs[3], [11, 12, EOS], good_lp, 0),
        (drifted, [7], [-0.3], 0),
        (hs[4], [13, EOS], good_lp[:2], 0),
        (hs[5], [14, 15, 16, EOS], good_lp + [-1.0], 0),
    ]
    coords = sink.finish_requests(finished)
    want = {"r0": None, "r1": "nonfinite_logprobs", "r2": "logprobs_length_mismatch:1!=3",
            "r3": "stage_failed:StagingConflict", "p": "prefix_mismatch", "r4": None, "r5": None}
    assert [(c["rollout_id"], c["failure_reason"]) for c in coords] == list(want.items())  # in batch order
    for c in coords:
        assert c["disposition"] == ("staged" if want[c["rollout_id"]] is None else "capture_failed")
        call = ledger.get(c["rollout_id"], c["model_call_id"])
        if want[c["rollout_id"]] is None:
            assert call.committed and call.digest == c["digest"] and dp.has(call.staging_key)
        else:
            assert call.status == "failed" and call.failure_reason == want[c["rollout_id"]]
    assert not dp.has("r1/c0") and not dp.has("r2/c0") and dp.fetch("r3/c0") == {"someone": "else"}
    receipts = [build_receipt(rid, ledger, reward=1.0) for rid in rids]
    samples, metrics = finalize_group(receipts, dp, ledger)
    assert [isinstance(s, Sample) for s in samples] == [True, False, False, False, True, True]
    assert samples[5].token_ids == [1, 5, 3, 14, 15, 16, EOS] and samples[5].prompt_len == 3
    assert metrics["finalize/masked_count"] == 3.0
    assert sink.stats()["capture/staged"] == 4 and sink.stats()["capture/failed"] == 4
    sink.close()


class _OrderSpy:
    """The real store; checks at every stage_many call that none of the
    batch's calls has a ledger outcome yet (ledger strictly after the ack)."""

    def __init__(self, store, ledger_path, lose_batch=False):
        self.store, self.ledger, self.lose_batch = store, CaptureLedger(ledger_path), lose_batch
        self.batches = []

    def stage_many(self, items):
        for key, _ in items:
            rid, cid = key.split("/")
            assert self.ledger.get(rid, cid) is None, f"{key} has a ledger outcome before its stage"
        self.batches.append([k for k, _ in items])
        if self.lose_batch:
            raise ConnectionError("data plane actor died")
        return self.store.stage_many(items)


def test_batch_ledger_records_only_after_the_durable_stage(stores):
    cfg, ledger, dp = stores
    spy = _OrderSpy(dp, cfg["ledger_path"])
    sink = CaptureSink(spy, CaptureLedger(cfg["ledger_path"]))
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    hs = _roots(admitter, sink, ["a", "b", "c"])
    coords = sink.finish_requests([(h, [20 + i, EOS], [-0.5, -0.5], 1) for i, h in enumerate(hs)])
    assert spy.batches == [["a/c0", "b/c0", "c/c0"]]  # one stage call for the whole batch
    assert all(c["disposition"] == "staged" for c in coords)
    assert all(ledger.get(r, "c0").committed for r in "abc")
    # the whole batch lost: every call fails, nothing is committed or staged
    lost = _OrderSpy(dp, cfg["ledger_path"], lose_batch=True)
    sink2 = CaptureSink(lost, CaptureLedger(cfg["ledger_path"]))
    hs = _roots(admitter, sink2, ["d", "e"])
    coords = sink2.finish_requests([(h, [7, EOS], [-0.5, -0.5], 1) for h in hs])
    assert [c["failure_reason"] for c in coords] == ["stage_failed:ConnectionError"] * 2
    assert [ledger.get(r, "c0").status for r in "de"] == ["failed", "failed"]
    assert not dp.has("d/c0") and not dp.has("e/c0")
    spy.ledger.close(); lost.ledger.close(); sink.close(); sink2.close()


def test_batch_and_one_by_one_write_identical_records(tmp_path):
    def run(kind):
        ledger, dp = CaptureLedger(tmp_path / kind / "l.sqlite"), StagingDB(tmp_path / kind / "d.sqlite")
        sink = CaptureSink(dp, CaptureLedger(tmp_path / kind / "l.sqlite"), fail_stage_rate=0.3, seed=2)
        admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
        rids = [f"r{i}" for i in range(8)]
        hs = _roots(admitter, sink, rids)
        finished = [(h, [10 + i, 11, EOS], np.array([-0.25, -0.5, -0.75]), 0) for i, h in enumerate(hs)]
        coords = sink.finish_requests(finished) if kind == "batch" else [sink.finish_request(*f) for f in finished]
        out = coords, [ledger.manifest(r) for r in rids], [(k, dp.fetch(k)) for k in dp.keys("")], sink.stats()
        sink.close(); ledger.close(); dp.close()
        return out

    batch, single = run("batch"), run("single")
    assert batch == single
    assert batch[3]["capture/injected_failures"] == 3  # seed 2: r1, r4, r5 fail
    assert [c["disposition"] for c in batch[0]].count("capture_failed") == 3


def test_record_many_isolates_records_that_break_the_outcome_rules(stores):
    _, ledger, _ = stores
    from harness.capture.records import CallRecord

    def committed(cid):
        return CallRecord("r", cid, "committed", prev_len=0, delta_len=1, cum_len=1, digest="d", staging_key=f"r/{cid}",
                          staging_chain=(f"r/{cid}",), chain_hash="h", cumulative_hash="c")

    def failed(cid, why):
        return CallRecord("r", cid, "failed", failure_reason=why)

    ledger.record(committed("c0"))
    out = ledger.record_many([failed("c0", "late"), failed("c1", "first"), committed("c2"), failed("c1", "second"),
                              committed("c1"), committed("c0")])
    assert [type(e).__name__ if e else None for e in out] == ["LedgerError", None, None, None, "LedgerError", None]
    assert "r/c0 already has outcome 'committed'" in str(out[0]) and "'failed'" in str(out[4])
    assert ledger.get("r", "c0").committed and ledger.get("r", "c2").committed
    assert ledger.get("r", "c1").failure_reason == "first"  # the first failure reason is kept
    assert ledger.record_many([]) == []


def test_finish_requests_refuses_unknown_or_repeated_handles_before_writing(stores):
    cfg, ledger, dp = stores
    sink = CaptureSink.from_config(cfg)
    (h,) = _roots(CaptureAdmitter(ledger, dp, eos_token_id=EOS), sink, ["r"])
    with pytest.raises(KeyError, match="'r/zz' is not in flight"):
        sink.finish_requests([(h, [4], [-0.1], 0), ("r/zz", [4], [-0.1], 0)])
    with pytest.raises(ValueError, match="'r/c0' appears twice"):
        sink.finish_requests([(h, [4], [-0.1], 0), (h, [4], [-0.1], 0)])
    assert sink.in_flight() == ["r/c0"] and ledger.get("r", "c0") is None and not dp.has("r/c0")
    assert [c["failure_reason"] for c in sink.abort_requests([h], "shutdown")] == ["aborted:shutdown"]
    assert ledger.get("r", "c0").failure_reason == "aborted:shutdown" and sink.in_flight() == []
    assert sink.finish_requests([]) == []
    sink.close()
