"""Fail closed on empty training (issue 23 item 2), below the runner: the
verified-sample check over placeholders that real capture failures produced
on real SQLite stores, and the spec field that sets its threshold.

The run-level half (a real run whose staging never commits ends as failed and
``golden capture`` / ``refresh`` / ``check`` give no verdict) is
``suites/faults/test_empty_training_run.py``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from harness.capture.admission import CaptureAdmitter
from harness.capture.finalize import Placeholder, Sample, finalize_from_ledger, mask_cause
from harness.capture.ledger import CaptureLedger
from harness.capture.sink import CaptureSink
from harness.dataplane.staging_db import StagingDB
from harness.grpo.trainer import EmptyTrainingStep, check_verified, min_verified_samples
from harness.spec import SpecError, list_workloads, load_spec, spec_digest

REPO = Path(__file__).resolve().parents[2]
GOLDENS = REPO / "goldens"
EOS = 2


def _masked_mix(tmp_path):
    """Six rollouts, one call each, through the real admitter / sink / finaliser:
    r0 and r5 train; r1's logprobs are NaN (failure row), r2 is admitted and begun
    but never finished (no outcome row), r3's staged row vanishes and r4's is
    tampered after the commit (both fail verification at finalisation)."""
    ledger = CaptureLedger(tmp_path / "ledger.sqlite")
    dp = StagingDB(tmp_path / "dataplane.sqlite")
    sink = CaptureSink(StagingDB(tmp_path / "dataplane.sqlite"), CaptureLedger(tmp_path / "ledger.sqlite"))
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    rids = [f"r{i}" for i in range(6)]
    results = [admitter.admit_root(r, "c0", [1, 5, 3]) for r in rids]
    handles = sink.begin_requests([(res.request_capture(), res.prompt_ids) for res in results], weight_version=1)
    finished = [(h, [40 + i, EOS], [-0.5, float("nan") if r == "r1" else -0.25], 1)
                for i, (r, h) in enumerate(zip(rids, handles)) if r != "r2"]
    sink.finish_requests(finished)
    raw = sqlite3.connect(tmp_path / "dataplane.sqlite")
    raw.execute("DELETE FROM rows WHERE key = 'r3/c0'")
    raw.execute("UPDATE rows SET digest = 'x' WHERE key = 'r4/c0'")
    raw.commit()
    raw.close()
    _, samples, _ = finalize_from_ledger([(r, 1.0, "c0") for r in rids], ledger, dp)
    sink.close(); ledger.close(); dp.close()
    return samples


def test_mask_causes_name_what_masked_each_rollout(tmp_path):
    samples = _masked_mix(tmp_path)
    assert [type(s) for s in samples] == [Sample, Placeholder, Placeholder, Placeholder, Placeholder, Sample]
    assert [mask_cause(s.reason) for s in samples[1:5]] == [
        "failed call (nonfinite_logprobs)",
        "unfinished call (no_calls)",  # its only call has no outcome row
        "verification failed (fetch_failed:KeyError)",
        "verification failed (fetch_failed:DigestMismatch)",
    ]
    # the other finalisation checks drop the key, so equal causes count together
    assert mask_cause("chain_hash_mismatch:r7/c1") == mask_cause("chain_hash_mismatch:r9/c0") \
        == "verification failed (chain_hash_mismatch)"
    assert mask_cause("call_failed:c2:stage_failed:InjectedStagingFailure") == \
        "failed call (stage_failed:InjectedStagingFailure)"
    assert mask_cause("no_trainable_tokens") == "no trainable tokens"
    assert mask_cause("incomplete_call:c1") == "unfinished call (incomplete_call)"
    assert mask_cause("ambiguous_terminal:fork at c0") == "ambiguous_terminal"


def test_a_step_below_the_threshold_fails_naming_step_counts_and_causes(tmp_path):
    samples = _masked_mix(tmp_path)
    check_verified(2, samples, 2)  # two verified: enough
    with pytest.raises(EmptyTrainingStep) as info:
        check_verified(2, samples, 3)
    assert str(info.value) == (
        "step 2: 2 of 6 samples verified, fewer than grpo.min_verified_samples = 3: the step is not trained "
        "and the run fails. Masked: 1 by failed call (nonfinite_logprobs), e.g. r1; "
        "1 by unfinished call (no_calls), e.g. r2; 1 by verification failed (fetch_failed:DigestMismatch), "
        "e.g. r4; 1 by verification failed (fetch_failed:KeyError), e.g. r3"
    )
    masked_only = [s for s in samples if s.masked] * 4
    with pytest.raises(EmptyTrainingStep, match=r"^step 7: 0 of 16 samples verified, fewer than "
                                                r"grpo\.min_verified_samples = 1: .* Masked: 4 by failed call"):
        check_verified(7, masked_only, 1)
    check_verified(7, masked_only, 0)  # 0 turns the check off


def test_threshold_field_is_optional_and_moves_no_digest():
    for name in list_workloads(GOLDENS):
        spec = load_spec(name, goldens_root=GOLDENS)
        assert "min_verified_samples" not in spec["grpo"], name  # no default filled in: digests unchanged
        assert min_verified_samples(spec) == 1
        for platform in ("cpu", "cuda", "cpu-vllm"):
            manifest = GOLDENS / name / platform / "manifest.json"
            if manifest.is_file() and name != "qwen3_moe_tiny_smoke":  # smoke's yaml changed after its capture
                stored = json.loads(manifest.read_text())["workload"]["spec_digest"]
                why = "the loaded spec no longer has the digest its golden was captured with (a new default?)"
                assert stored == spec_digest(spec), f"{name} [{platform}]: {why}"
    spec = load_spec("qwen3_moe_tiny_smoke", ["grpo.min_verified_samples=12"], goldens_root=GOLDENS)
    assert min_verified_samples(spec) == 12
    assert spec_digest(spec) != spec_digest(load_spec("qwen3_moe_tiny_smoke", goldens_root=GOLDENS))
    for bad, why in (("-1", "must be >= 0"), ("1.5", "expected integer"), ("true", "expected integer")):
        with pytest.raises(SpecError, match=rf"grpo\.min_verified_samples: {why}"):
            load_spec("qwen3_moe_tiny_smoke", [f"grpo.min_verified_samples={bad}"], goldens_root=GOLDENS)
