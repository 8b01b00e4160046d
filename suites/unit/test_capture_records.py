"""Validation rules of the capture records (docs/capture.md)."""

from __future__ import annotations

import pytest

from harness.capture.digests import chain_hash, delta_digest
from harness.capture.records import (
    CallRecord,
    CaptureAdmission,
    CaptureValidationError,
    CommitCoords,
    RolloutReceipt,
    StagedCall,
)

H = "ab" * 32


def test_text_admission_is_a_parentless_root():
    CaptureAdmission("r", "c", "text")
    with pytest.raises(CaptureValidationError, match=r"CaptureAdmission\.parent_call_id"):
        CaptureAdmission("r", "c", "text", parent_call_id="p")
    with pytest.raises(CaptureValidationError, match=r"CaptureAdmission\.prev_len"):
        CaptureAdmission("r", "c", "text", prev_len=3)
    with pytest.raises(CaptureValidationError, match=r"required_prefix_token_ids"):
        CaptureAdmission("r", "c", "text", required_prefix_token_ids=[])


def test_token_in_admission_needs_parent_hash_and_chain_or_prefix():
    CaptureAdmission("r", "c", "token_in", parent_call_id="p", prev_len=2, staging_chain=["r/p"], parent_chain_hash=H)
    CaptureAdmission("r", "c", "token_in", parent_call_id="p", prev_len=2, required_prefix_token_ids=[1, 2],
                     parent_chain_hash=H)
    with pytest.raises(CaptureValidationError, match=r"\.parent_call_id"):
        CaptureAdmission("r", "c", "token_in", prev_len=2, staging_chain=["r/p"], parent_chain_hash=H)
    with pytest.raises(CaptureValidationError, match=r"\.prev_len"):
        CaptureAdmission("r", "c", "token_in", parent_call_id="p", prev_len=0, staging_chain=["r/p"],
                         parent_chain_hash=H)
    with pytest.raises(CaptureValidationError, match=r"\.parent_chain_hash"):
        CaptureAdmission("r", "c", "token_in", parent_call_id="p", prev_len=2, staging_chain=["r/p"])
    with pytest.raises(CaptureValidationError, match=r"required_prefix_token_ids.*prev_len=3.*got 2"):
        CaptureAdmission("r", "c", "token_in", parent_call_id="p", prev_len=3, required_prefix_token_ids=[1, 2],
                         parent_chain_hash=H)
    with pytest.raises(CaptureValidationError, match=r"staging_chain.*'r/p'"):
        CaptureAdmission("r", "c", "token_in", parent_call_id="p", prev_len=2, staging_chain=["r/x"],
                         parent_chain_hash=H)
    with pytest.raises(CaptureValidationError, match=r"\.mode"):
        CaptureAdmission("r", "c", "tokens")


def test_from_dict_refuses_unknown_fields_and_round_trips():
    a = CaptureAdmission("r", "c", "token_in", parent_call_id="p", prev_len=2, staging_chain=["r/p"],
                         parent_chain_hash=H)
    assert CaptureAdmission.from_dict(a.to_dict()) == a
    with pytest.raises(CaptureValidationError, match=r"CaptureAdmission\.bogus: unknown field"):
        CaptureAdmission.from_dict({**a.to_dict(), "bogus": 1})
    with pytest.raises(CaptureValidationError, match="rollout_id.*'/'"):
        CaptureAdmission("a/b", "c", "text")


def test_commit_coords_rules():
    CommitCoords("r", "c", "staged", 2, 3, 5, digest=H, staging_key="r/c", chain_hash=H, cumulative_hash=H)
    with pytest.raises(CaptureValidationError, match=r"CommitCoords\.cum_len"):
        CommitCoords("r", "c", "staged", 2, 3, 6, digest=H, staging_key="r/c", chain_hash=H, cumulative_hash=H)
    with pytest.raises(CaptureValidationError, match=r"CommitCoords\.chain_hash: required"):
        CommitCoords("r", "c", "staged", 2, 3, 5, digest=H, staging_key="r/c", cumulative_hash=H)
    CommitCoords("r", "c", "capture_failed", 2, 0, 2, failure_reason="x")
    with pytest.raises(CaptureValidationError, match=r"CommitCoords\.digest: must be None"):
        CommitCoords("r", "c", "capture_failed", 2, 0, 2, digest=H, failure_reason="x")
    with pytest.raises(CaptureValidationError, match=r"CommitCoords\.delta_len"):
        CommitCoords("r", "c", "capture_failed", 2, 1, 3, failure_reason="x")


def test_staged_call_mask_logprob_and_digest_rules():
    s = StagedCall.build("r/c", 0, [5, 6, 7], [0, 1, 1], [9.0, -0.1, -0.2])
    assert s.generation_log_probs_delta[0] == 0.0  # forced to 0.0 under mask 0
    assert s.digest == delta_digest([5, 6, 7], [0, 1, 1], s.generation_log_probs_delta)
    assert StagedCall.from_row(s.to_row()) == s
    with pytest.raises(CaptureValidationError, match=r"StagedCall\[r/c\]\.digest"):
        StagedCall.from_row({**s.to_row(), "token_ids_delta": [5, 6, 8]})
    with pytest.raises(CaptureValidationError, match=r"token_mask_delta: position 0 holds 2"):
        StagedCall("r/c", 0, (1,), (2,), (0.0,), H)
    with pytest.raises(
        CaptureValidationError, match=r"generation_log_probs_delta: position 0 is -1.0 where the mask is 0"
    ):
        StagedCall("r/c", 0, (1,), (0,), (-1.0,), H)
    with pytest.raises(CaptureValidationError, match=r"token_mask_delta: length 1 != 2"):
        StagedCall("r/c", 0, (1, 2), (0,), (0.0, 0.0), H)


def _committed(cid, parent=None, chain=None, prev=0, n=3):
    return CallRecord("r", cid, "committed", parent_call_id=parent, prev_len=prev, delta_len=n, cum_len=prev + n,
                      digest=H, staging_key=f"r/{cid}", staging_chain=chain or (f"r/{cid}",),
                      chain_hash=chain_hash(None, H), cumulative_hash=H)


def test_call_record_rules():
    _committed("a")
    with pytest.raises(CaptureValidationError, match="staging_chain: must end with the record's own"):
        _committed("a", chain=("r/b",))
    with pytest.raises(CaptureValidationError, match="a root has a one-key chain"):
        _committed("b", parent="a", chain=("r/b",))
    with pytest.raises(CaptureValidationError, match=r"CallRecord\[r/x\]\.failure_reason"):
        CallRecord("r", "x", "failed")


def test_receipt_rules():
    a, b = _committed("a"), _committed("b", parent="a", chain=("r/a", "r/b"), prev=3)
    RolloutReceipt("r", 1.0, (a, b), terminal_model_call_id="b", terminal_selection="declared")
    with pytest.raises(CaptureValidationError, match="not unique"):
        RolloutReceipt("r", 1.0, (a, a), terminal_model_call_id="a", terminal_selection="declared")
    with pytest.raises(CaptureValidationError, match="terminal_model_call_id: 'z' is not in the manifest"):
        RolloutReceipt("r", 1.0, (a,), terminal_model_call_id="z", terminal_selection="declared")
    with pytest.raises(CaptureValidationError, match="terminal_selection: required"):
        RolloutReceipt("r", 1.0, (a,), terminal_model_call_id="a")
    with pytest.raises(CaptureValidationError, match="failure_reason: required when the rollout is poisoned"):
        RolloutReceipt("r", 1.0, (a,), capture_poisoned=True)
    with pytest.raises(CaptureValidationError, match="reward"):
        RolloutReceipt("r", float("nan"), (a,), terminal_model_call_id="a", terminal_selection="declared")
    r = RolloutReceipt("r", 0.5, (a, b), terminal_model_call_id="b", terminal_selection="heuristic")
    assert RolloutReceipt.from_dict(r.to_dict()) == r
