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
from harness.capture.finalize import Placeholder, Sample, finalize_group, finalize_rollout, rollout_summary
from harness.capture.ledger import CaptureLedger, LedgerError
from harness.capture.receipt import build_receipt
from harness.capture.records import CaptureValidationError
from harness.capture.sink import CaptureSink, capture_config_from_spec
from harness.dataplane.store import DataPlaneStore

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
    ledger, dp = CaptureLedger(cfg["ledger_path"]), DataPlaneStore(cfg["dataplane_path"])
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
    cfg, ledger, dp = stores
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
    spec = {"seed": 7, "capture": {"enabled": True, "fail_stage_rate": 0.1}}
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
    d2 = DataPlaneStore.restore(tmp_path / "ckpt" / "dataplane.sqlite", tmp_path / "restored" / "dataplane.sqlite")
    assert l2.rollout_ids() == ["r"] and l2.manifest("r") == ledger.manifest("r")
    a = finalize_rollout(build_receipt("r", l2, reward=1.0), d2, l2)
    b = finalize_rollout(build_receipt("r", ledger, reward=1.0), dp, ledger)
    assert isinstance(a, Sample) and a == b
    l2.close(); d2.close(); sink.close()
