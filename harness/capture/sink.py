"""Engine-side capture: `CaptureSink`, called by the rollout engine owner.

Per captured request (one carrying `request["capture"]`, an admission dict):

    handle = sink.begin_request(admission, prompt_ids, weight_version=v0)
    ...generate...
    coords = sink.finish_request(handle, output_ids, logprobs, weight_version=v1)
    # or: coords = sink.abort_request(handle, reason)

Commit ordering (the invariant everything else relies on):
    delta -> dataplane.stage (durable ack) -> commit coords -> ledger CallRecord.
A call is a resolvable parent only once its ledger row exists, and that row is
written only after the staged bytes are durable. Any failure on the way
writes a failure row instead and returns `capture_failed` coords; nothing
raises into the engine for a capture problem (generation goes on, the rollout
is masked at finalisation). Programming errors (unknown handle, a malformed
admission without ids) do raise.

Epochs: the admission epoch is the weight version at `begin_request` (or at
finish when begin had none). A request whose finish version differs spans a
refit: it keeps its admission epoch, `epoch_span_count` counts it and a
WARNING is logged.

Group commit: `finish_requests` takes every request that finished together
(the engine owner calls it once per `generate()` batch) and pays one
data-plane transaction and one ledger transaction for all of them; the
ordering invariant holds per call (no ledger record before its row's durable
ack) and failures stay per call. `finish_request` is a batch of one.
`begin_requests` begins a whole batch with batched ledger reads, all or
nothing (a batch that cannot begin leaves no handle in flight and raises
`CaptureBeginError` naming the item); `begin_request` is a batch of one.

Thread-safe (one lock); blocking. A finish batch fsyncs once whatever its size (the stage
commit; the ledger outcome commit is `synchronous=NORMAL` unless `ledger_sync="full"`,
see docs/capture.md "Durability").

A call's state and the records it ends in: ``calls.py``; the sink's plain config
(``from_config``, ``capture_config_from_spec``, re-exported here): ``sink_config.py``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from harness.capture.calls import (
    FinishingCall,
    InjectedStagingFailure,
    PendingCall,
    check_lineage,
    committed_record,
    failure_record,
    item_name,
    prepare_call,
)
from harness.capture.digests import error_name, unit_interval
from harness.capture.ledger import CaptureLedger
from harness.capture.records import CallRecord, CaptureAdmission, CaptureValidationError
from harness.capture.sink_config import capture_config_from_spec, sink_parts

__all__ = ["CaptureBeginError", "CaptureSink", "InjectedStagingFailure", "capture_config_from_spec"]

log = logging.getLogger(__name__)


class CaptureBeginError(RuntimeError):
    """A batch of requests could not begin; `index` is the item at fault
    (None: the ledger failed for the whole batch). Chained to the cause."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message, index)
        self.index = index

    def __str__(self) -> str:
        return str(self.args[0])


def _stage_many(dataplane: Any, rows: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """`dataplane.stage_many(rows)`; a data plane without it stages row by row."""
    batch = getattr(dataplane, "stage_many", None)
    if callable(batch):
        return list(batch(rows))
    out: list[Any] = []
    for key, row in rows:
        try:
            out.append(dataplane.stage(key, row))
        except Exception as exc:  # noqa: BLE001 - one row's error is that row's outcome
            out.append(exc)
    return out


class CaptureSink:
    """Stages token deltas and writes ledger rows for one engine owner."""

    def __init__(self, dataplane: Any, ledger: CaptureLedger, *, fail_stage_rate: float = 0.0, seed: int = 0,
                 ledger_sync: str = "normal"):
        """`ledger_sync`: "normal" (default) or "full", the durability of the
        ledger outcome commits (the stage commit is always fsynced first; see
        docs/capture.md "Durability")."""
        if not 0.0 <= float(fail_stage_rate) <= 1.0:
            raise ValueError(f"capture.fail_stage_rate must be in [0, 1], got {fail_stage_rate!r}")
        if ledger_sync not in ("normal", "full"):
            raise ValueError(f"capture sink ledger_sync must be 'normal' or 'full', got {ledger_sync!r}")
        self._sync_outcomes = ledger_sync == "full"
        self.dataplane = dataplane
        self.ledger = ledger
        self.fail_stage_rate = float(fail_stage_rate)
        self.seed = int(seed)
        self._pending: dict[str, PendingCall] = {}
        self._lock = threading.RLock()
        self.staged = 0
        self.failed = 0
        self.injected_failures = 0
        self.epoch_span_count = 0

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> CaptureSink:
        """Build from plain config (works inside a Ray actor; the keys:
        ``harness.capture.sink_config.sink_parts``)."""
        dataplane, ledger, kwargs = sink_parts(cfg)
        return cls(dataplane, ledger, **kwargs)

    # -- request lifecycle -------------------------------------------------
    def begin_request(self, admission: dict[str, Any], prompt_ids: Sequence[int], *,
                      weight_version: int | None = None) -> str:
        """Validate the admission against the ledger; return an opaque handle.
        (A batch of one: see `begin_requests`; raises the underlying error.)"""
        try:
            return self.begin_requests([(admission, prompt_ids)], weight_version=weight_version)[0]
        except CaptureBeginError as exc:
            raise (exc.__cause__ or exc) from None

    def begin_requests(self, items: Sequence[tuple[Any, Sequence[int]]], *,
                       weight_version: int | None = None) -> list[str]:
        """Begin every `(admission, prompt_ids)` of one engine batch; one handle
        per item, in order.

        Batched I/O: one query for the admission numbers (one transaction
        admits the calls no trainer admitted), one for existing outcomes, one
        for the parents of `token_in` calls, one transaction for the failure
        rows of calls poisoned here (duplicate id, lineage or prefix mismatch).

        All or nothing: if an item cannot begin (a malformed admission -- its
        failure row is written when its ids are known --, a call already in
        flight or twice in the batch) or the ledger fails, NO handle of the
        batch is left in flight: every other call of the batch gets a failure
        row `aborted:begin_failed` (fail closed; a call in flight elsewhere
        is left alone) and `CaptureBeginError` is raised naming the item
        (`.index`, its staging key) and chained to the cause.
        """
        with self._lock:
            parsed: list[tuple[CaptureAdmission, list[int]]] = []
            error: tuple[int | None, BaseException] | None = None
            seen: set[str] = set()
            for i, (admission, prompt_ids) in enumerate(items):
                try:
                    adm = self._parse_admission(admission)
                    if adm.staging_key in self._pending or adm.staging_key in seen:
                        raise ValueError(f"capture request {adm.staging_key!r} is already in flight")
                    prompt = list(map(int, prompt_ids))
                except Exception as exc:  # noqa: BLE001 - the batch fails below, naming this item
                    if error is None:
                        error = (i, exc)
                    continue
                seen.add(adm.staging_key)
                parsed.append((adm, prompt))
            if error is None:
                try:
                    pendings = self._begin_parsed(parsed, weight_version)
                except Exception as exc:  # noqa: BLE001 - a ledger failure: nothing of the batch begins
                    error = (None, exc)
                else:
                    for p in pendings:
                        self._pending[p.admission.staging_key] = p
                    return [p.admission.staging_key for p in pendings]
            index, cause = error
            self._abort_unbegun([adm for adm, _ in parsed])
            what = f"item {index} ({item_name(items[index][0])})" if index is not None else f"a batch of {len(items)}"
            raise CaptureBeginError(f"capture could not begin {what}: {type(cause).__name__}: {cause}",
                                    index) from cause

    def _begin_parsed(self, parsed: list[tuple[CaptureAdmission, list[int]]],
                      weight_version: int | None) -> list[PendingCall]:
        """The ledger work of `begin_requests` for validated items (no state change on error)."""
        calls = [(adm.rollout_id, adm.model_call_id) for adm, _ in parsed]
        seqs = self.ledger.admission_seqs(calls)
        unadmitted = [i for i, seq in enumerate(seqs) if seq is None]
        # engine-side admission (no trainer admitter in the loop)
        for i, seq in zip(unadmitted, self.ledger.admit_many([parsed[i][0] for i in unadmitted])):
            seqs[i] = seq
        outcomes = self.ledger.get_many(calls)
        children = [i for i, (adm, _) in enumerate(parsed) if adm.mode == "token_in" and outcomes[i] is None]
        parents = self.ledger.get_many([(parsed[i][0].rollout_id, parsed[i][0].parent_call_id or "")
                                        for i in children])
        parent_of = dict(zip(children, parents))
        pendings: list[PendingCall] = []
        failures: list[CallRecord] = []
        for i, ((adm, prompt), seq) in enumerate(zip(parsed, seqs)):
            pending = PendingCall(adm, prompt, weight_version, (adm.staging_key,), seq)
            if outcomes[i] is not None:
                # The call already has an outcome; it stands, this request is not captured.
                pending.failure_reason = "duplicate_call_id"
            elif adm.mode == "token_in":
                why, chain = check_lineage(adm, prompt, parent_of[i])
                pending.failure_reason = why
                pending.staging_chain = chain + (adm.staging_key,)
                if why is not None:
                    failures.append(CallRecord(rollout_id=adm.rollout_id, model_call_id=adm.model_call_id,
                                               status="failed", parent_call_id=adm.parent_call_id,
                                               admission_seq=seq, failure_reason=why))
            pendings.append(pending)
        for err in self.ledger.record_many(failures, sync=self._sync_outcomes):
            if err is not None:
                raise err
        self.failed += sum(1 for p in pendings if p.failure_reason is not None)
        return pendings

    def _abort_unbegun(self, admissions: list[CaptureAdmission]) -> None:
        """Failure rows for the calls of a batch that could not begin (best
        effort: a call that already has an outcome keeps it)."""
        try:
            seqs = self.ledger.admission_seqs([(a.rollout_id, a.model_call_id) for a in admissions])
            records = [CallRecord(rollout_id=a.rollout_id, model_call_id=a.model_call_id, status="failed",
                                  parent_call_id=a.parent_call_id, admission_seq=seq,
                                  failure_reason="aborted:begin_failed")
                       for a, seq in zip(admissions, seqs)]
            written = sum(1 for err in self.ledger.record_many(records, sync=self._sync_outcomes) if err is None)
        except Exception:
            log.exception("capture: could not write the failure rows of a batch that failed to begin")
            return
        self.failed += written

    def finish_request(self, handle: str, output_ids: Sequence[int], logprobs: Any,
                       weight_version: int | None) -> dict[str, Any]:
        """Stage the delta durably, then commit; return token-free coords.
        (A batch of one: see `finish_requests`.)"""
        return self.finish_requests([(handle, output_ids, logprobs, weight_version)])[0]

    def finish_requests(self, finished: Sequence[tuple[str, Sequence[int], Any, int | None]]
                        ) -> list[dict[str, Any]]:
        """Group commit of every request that finished together (one engine
        step / one `generate()` call): `finished` holds
        `(handle, output_ids, logprobs, weight_version)` tuples; returns one
        coords dict per item, in order.

        One data-plane transaction stages all good deltas (one round trip to a
        data-plane actor), then one ledger transaction writes every outcome:
        the committed records of the rows the stage acknowledged durable, and
        the failure rows of the rest. A call that fails (bad logprobs, empty
        delta, injected or real staging error, ledger refusal) gets its own
        failure row and `capture_failed` coords; the others commit. Unknown or
        repeated handles raise `KeyError` / `ValueError` before anything is
        written.
        """
        with self._lock:
            handles = [item[0] for item in finished]
            if len(set(handles)) != len(handles):
                dup = next(h for h in handles if handles.count(h) > 1)
                raise ValueError(f"capture request {dup!r} appears twice in one finish batch")
            for h in handles:
                if h not in self._pending:
                    raise KeyError(f"capture request {h!r} is not in flight")
            calls = [self._prepare(self._pending.pop(h), out, lp, v) for h, out, lp, v in finished]
            self._stage(calls)
            self._commit(calls)
            return [c.coords() for c in calls]

    def _prepare(self, pending: PendingCall, output_ids: Sequence[int], logprobs: Any,
                 weight_version: int | None) -> FinishingCall:
        """``prepare_call`` with the sink's refit-span count and staging-failure injection."""
        call = prepare_call(pending, output_ids, logprobs, weight_version, inject=self._inject_failure)
        if not call.prewritten and call.epoch is not None and weight_version is not None \
                and weight_version != call.epoch:
            self.epoch_span_count += 1
            log.warning("capture: request %s spans a refit (admitted at weight version %s, finished at %s); "
                        "keeping the admission epoch", pending.admission.staging_key, call.epoch, weight_version)
        return call

    def _inject_failure(self, staging_key: str) -> bool:
        """Whether ``capture.fail_stage_rate`` fails this call's staging (counted)."""
        if self.fail_stage_rate > 0.0 and unit_interval(self.seed, staging_key) < self.fail_stage_rate:
            self.injected_failures += 1
            return True
        return False

    def _stage(self, calls: list[FinishingCall]) -> None:
        """Stage every prepared row in one durable transaction; mark failures."""
        todo = [c for c in calls if c.reason is None]
        if not todo:
            return
        rows = [(c.pending.admission.staging_key, c.staged.to_row()) for c in todo]  # type: ignore[union-attr]
        try:
            acks = _stage_many(self.dataplane, rows)  # returns after the durable ack
        except Exception as exc:  # noqa: BLE001 - the batch transaction (or the actor) failed: nothing is staged
            acks = [exc] * len(todo)
        for c, ack in zip(todo, acks):
            if isinstance(ack, BaseException):
                c.reason = f"stage_failed:{error_name(ack)}"

    def _commit(self, calls: list[FinishingCall]) -> None:
        """Write the ledger outcomes of a staged batch in one transaction."""
        for c in calls:
            if c.reason is None:
                c.record = committed_record(c)
        batch = [c for c in calls if not c.prewritten]
        outcomes = self._write_outcomes([c.record if c.record is not None else failure_record(c)
                                         for c in batch])
        refused = []
        for c, err in zip(batch, outcomes):
            if err is None:
                if c.record is not None:
                    self.staged += 1
                else:
                    self.failed += 1
            elif c.record is not None:  # the commit was refused: the call fails instead
                c.record, c.reason = None, f"commit_failed:{error_name(err)}"
                refused.append(c)
            else:
                raise err  # a failure row could not be written: fail loudly, never silently commit
        if refused:
            for err in self._write_outcomes([failure_record(c) for c in refused]):
                if err is not None:
                    raise err
            self.failed += len(refused)

    def _write_outcomes(self, records: list[CallRecord]) -> list[Exception | None]:
        """`ledger.record_many`; if the batch transaction itself fails, write
        the records one by one so one bad record cannot take the others down."""
        if not records:
            return []
        try:
            return list(self.ledger.record_many(records, sync=self._sync_outcomes))
        except Exception:  # noqa: BLE001 - retried record by record below
            log.warning("capture: ledger batch of %d outcomes failed; writing them one by one", len(records))
        out: list[Exception | None] = []
        for rec in records:
            try:
                self.ledger.record_many([rec], sync=self._sync_outcomes)
                out.append(None)
            except Exception as exc:  # noqa: BLE001 - that record's outcome
                out.append(exc)
        return out

    def abort_request(self, handle: str, reason: str) -> dict[str, Any]:
        """The engine gave up on the request: write a failure row."""
        return self.abort_requests([handle], reason)[0]

    def abort_requests(self, handles: Sequence[str], reason: str) -> list[dict[str, Any]]:
        """The engine gave up on a batch: one transaction of failure rows
        (`aborted:<reason>`, or the reason the request already failed with)."""
        with self._lock:
            for h in handles:
                if h not in self._pending:
                    raise KeyError(f"capture request {h!r} is not in flight")
            calls = []
            for h in handles:
                pending = self._pending.pop(h)
                call = FinishingCall(pending, None, pending.admission_epoch)
                call.reason = pending.failure_reason or f"aborted:{reason}"
                call.prewritten = pending.failure_reason is not None
                calls.append(call)
            self._commit(calls)
            return [c.coords() for c in calls]

    def in_flight(self) -> list[str]:
        with self._lock:
            return sorted(self._pending)

    def stats(self) -> dict[str, int]:
        return {"capture/staged": self.staged, "capture/failed": self.failed,
                "capture/injected_failures": self.injected_failures,
                "capture/epoch_span_count": self.epoch_span_count}

    def close(self) -> None:
        self.ledger.close()
        close = getattr(self.dataplane, "close", None)
        if callable(close):
            close()

    # -- internals ---------------------------------------------------------
    def _parse_admission(self, admission: Any) -> CaptureAdmission:
        if isinstance(admission, CaptureAdmission):
            return admission
        try:
            return CaptureAdmission.from_dict(admission)
        except CaptureValidationError as exc:
            ids = (admission.get("rollout_id"), admission.get("model_call_id")) if isinstance(admission, dict) else ()
            if len(ids) == 2 and all(isinstance(i, str) and i and "/" not in i for i in ids):
                # Known call, bad admission: poison it so the rollout is masked.
                self.ledger.record_failure(ids[0], ids[1], f"invalid_admission:{str(exc)[:200]}",
                                           parent_call_id=admission.get("parent_call_id"))
                self.failed += 1
            raise
