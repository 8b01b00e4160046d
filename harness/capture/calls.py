"""One captured call on its way through ``CaptureSink``: its state and the records it ends in.

``PendingCall`` is a request between ``begin_requests`` and its finish or abort;
``FinishingCall`` is one request of a finish (or abort) batch until its outcome is
written. The functions here turn a call into what the ledger and the engine see
(``committed_record``, ``failure_record``, ``FinishingCall.coords``) and re-check a
``token_in`` admission against its parent's ledger row (``check_lineage``); a finished
request is validated and its staged row built by ``prepare_call``. No I/O
and no sink state: the sink does the staging, the ledger writes and the counting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.capture.digests import chain_hash, cumulative_hash, error_name
from harness.capture.records import CallRecord, CaptureAdmission, CommitCoords, StagedCall

__all__ = ["FinishingCall", "InjectedStagingFailure", "PendingCall", "check_lineage", "committed_record",
           "failed_coords", "failure_record", "item_name", "prepare_call"]


class InjectedStagingFailure(RuntimeError):
    """Raised by the fault injector in place of a real staging error."""


def item_name(admission: Any) -> str:
    """`rollout_id/model_call_id` of a raw admission, as far as it has them."""
    if isinstance(admission, CaptureAdmission):
        return admission.staging_key
    if isinstance(admission, dict):
        return f"{admission.get('rollout_id')}/{admission.get('model_call_id')}"
    return f"<{type(admission).__name__}>"


@dataclass
class PendingCall:
    admission: CaptureAdmission
    prompt_ids: list[int]
    admission_epoch: int | None
    staging_chain: tuple[str, ...]
    admission_seq: int | None = None
    failure_reason: str | None = None


@dataclass
class FinishingCall:
    """One request of a finish batch on its way to an outcome."""

    pending: PendingCall
    version: int | None
    epoch: int | None
    reason: str | None = None        # set => the call fails with this reason
    prewritten: bool = False         # its failure row already exists (written at begin_request)
    staged: StagedCall | None = None
    output: list[int] | None = None
    record: CallRecord | None = None  # the committed record, once written

    def coords(self) -> dict[str, Any]:
        adm = self.pending.admission
        if self.record is None:
            return failed_coords(adm, self.reason or "capture_failed", self.epoch, self.version)
        r = self.record
        return CommitCoords(
            rollout_id=adm.rollout_id, model_call_id=adm.model_call_id, disposition="staged",
            prev_len=r.prev_len, delta_len=r.delta_len, cum_len=r.cum_len, digest=r.digest,
            staging_key=adm.staging_key, chain_hash=r.chain_hash, cumulative_hash=r.cumulative_hash,
            admission_epoch=self.epoch, weight_version=self.version,
        ).to_dict()


def prepare_call(pending: PendingCall, output_ids: Sequence[int], logprobs: Any, weight_version: int | None,
                 *, inject: Callable[[str], bool]) -> FinishingCall:
    """Validate one finished request and build its staged row (no I/O): the call, with
    ``reason`` set when it fails (bad logprobs, empty delta, a row that cannot be built,
    or ``inject(staging_key)`` true: an ``InjectedStagingFailure``). A call that failed
    at begin comes back ``prewritten``. ``epoch``: the admission epoch, else the finish
    version."""
    adm = pending.admission
    call = FinishingCall(pending, weight_version, pending.admission_epoch)
    if pending.failure_reason is not None:  # its failure row was written at begin_request
        call.reason, call.prewritten = pending.failure_reason, True
        return call
    epoch = pending.admission_epoch if pending.admission_epoch is not None else weight_version
    call.epoch = epoch
    output = list(map(int, output_ids))
    lp = np.asarray(logprobs.detach().cpu() if hasattr(logprobs, "detach") else logprobs,
                    dtype=np.float32).reshape(-1)
    if lp.shape[0] != len(output):
        call.reason = f"logprobs_length_mismatch:{lp.shape[0]}!={len(output)}"
        return call
    if not np.isfinite(lp).all():
        call.reason = "nonfinite_logprobs"
        return call
    new_prompt = pending.prompt_ids[adm.prev_len:]
    delta_ids = new_prompt + output
    if not delta_ids:
        call.reason = "empty_delta"
        return call
    mask = [0] * len(new_prompt) + [1] * len(output)
    delta_lp = np.concatenate([np.zeros(len(new_prompt), dtype=np.float32), lp])
    try:
        call.staged = StagedCall.build(adm.staging_key, adm.prev_len, delta_ids, mask, delta_lp, epoch)
        if inject(adm.staging_key):
            raise InjectedStagingFailure(f"injected staging failure for {adm.staging_key}")
    except Exception as exc:  # noqa: BLE001 - a capture problem fails the call, never the engine
        call.reason = f"stage_failed:{error_name(exc)}"
        return call
    call.output = output
    return call


def failed_coords(adm: CaptureAdmission, reason: str, epoch: int | None, version: int | None) -> dict[str, Any]:
    """The token-free coords of a call that failed with ``reason``."""
    return CommitCoords(
        rollout_id=adm.rollout_id, model_call_id=adm.model_call_id, disposition="capture_failed",
        prev_len=adm.prev_len, delta_len=0, cum_len=adm.prev_len, admission_epoch=epoch,
        weight_version=version, failure_reason=reason,
    ).to_dict()


def committed_record(c: FinishingCall) -> CallRecord:
    """The ledger row of a call whose delta was staged durably."""
    adm, staged, pending = c.pending.admission, c.staged, c.pending
    assert staged is not None and c.output is not None
    parent_hash = adm.parent_chain_hash if adm.mode == "token_in" else None
    delta_len = len(staged.token_ids_delta)
    return CallRecord(
        rollout_id=adm.rollout_id, model_call_id=adm.model_call_id, status="committed",
        parent_call_id=adm.parent_call_id, admission_seq=pending.admission_seq,
        prev_len=adm.prev_len, delta_len=delta_len, cum_len=adm.prev_len + delta_len,
        output_len=len(c.output), digest=staged.digest, staging_key=adm.staging_key,
        staging_chain=pending.staging_chain, chain_hash=chain_hash(parent_hash, staged.digest),
        cumulative_hash=cumulative_hash(pending.prompt_ids + c.output),
        admission_epoch=c.epoch, weight_version=c.version,
    )


def failure_record(c: FinishingCall) -> CallRecord:
    """The ledger row of a call that failed (``c.reason``)."""
    adm = c.pending.admission
    return CallRecord(rollout_id=adm.rollout_id, model_call_id=adm.model_call_id, status="failed",
                      parent_call_id=adm.parent_call_id, admission_seq=c.pending.admission_seq,
                      failure_reason=c.reason)


def check_lineage(adm: CaptureAdmission, prompt: list[int], parent: CallRecord | None
                  ) -> tuple[str | None, tuple[str, ...]]:
    """Re-check a `token_in` admission against its parent's ledger row:
    (None, the parent's staging chain) or (the failure reason, ())."""
    if parent is None:
        return "unresolved_parent:not_committed", ()
    if not parent.committed:
        return "unresolved_parent:parent_failed", ()
    if parent.chain_hash != adm.parent_chain_hash:
        return "unresolved_parent:chain_hash_mismatch", ()
    if parent.cum_len != adm.prev_len:
        return "unresolved_parent:prev_len_mismatch", ()
    if adm.staging_chain and tuple(adm.staging_chain) != tuple(parent.staging_chain):
        return "unresolved_parent:staging_chain_mismatch", ()
    if len(prompt) < adm.prev_len or cumulative_hash(prompt[: adm.prev_len]) != parent.cumulative_hash:
        return "prefix_mismatch", ()
    if adm.required_prefix_token_ids is not None and list(adm.required_prefix_token_ids) != prompt[: adm.prev_len]:
        return "prefix_mismatch", ()
    return None, tuple(parent.staging_chain)
