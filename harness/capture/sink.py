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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.capture.digests import (
    chain_hash,
    cumulative_hash,
    error_name,
    unit_interval,
)
from harness.capture.ledger import CaptureLedger
from harness.capture.records import (
    CallRecord,
    CaptureAdmission,
    CaptureValidationError,
    CommitCoords,
    StagedCall,
)

if TYPE_CHECKING:
    from harness.spec.typed import Workload

log = logging.getLogger(__name__)


class InjectedStagingFailure(RuntimeError):
    """Raised by the fault injector in place of a real staging error."""


class CaptureBeginError(RuntimeError):
    """A batch of requests could not begin; `index` is the item at fault
    (None: the ledger failed for the whole batch). Chained to the cause."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message, index)
        self.index = index

    def __str__(self) -> str:
        return str(self.args[0])


def _item_name(admission: Any) -> str:
    """`rollout_id/model_call_id` of a raw admission, as far as it has them."""
    if isinstance(admission, CaptureAdmission):
        return admission.staging_key
    if isinstance(admission, dict):
        return f"{admission.get('rollout_id')}/{admission.get('model_call_id')}"
    return f"<{type(admission).__name__}>"


@dataclass
class _Pending:
    admission: CaptureAdmission
    prompt_ids: list[int]
    admission_epoch: int | None
    staging_chain: tuple[str, ...]
    admission_seq: int | None = None
    failure_reason: str | None = None


@dataclass
class _Finish:
    """One request of a finish batch on its way to an outcome."""

    pending: _Pending
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
            return CaptureSink._failed_coords(adm, self.reason or "capture_failed", self.epoch, self.version)
        r = self.record
        return CommitCoords(
            rollout_id=adm.rollout_id, model_call_id=adm.model_call_id, disposition="staged",
            prev_len=r.prev_len, delta_len=r.delta_len, cum_len=r.cum_len, digest=r.digest,
            staging_key=adm.staging_key, chain_hash=r.chain_hash, cumulative_hash=r.cumulative_hash,
            admission_epoch=self.epoch, weight_version=self.version,
        ).to_dict()


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
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.RLock()
        self.staged = 0
        self.failed = 0
        self.injected_failures = 0
        self.epoch_span_count = 0

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> CaptureSink:
        """Build from plain config (works inside a Ray actor).

        Keys: `ledger_path` (required), exactly one of `dataplane_path` /
        `dataplane_actor` (a named `DataPlaneActor`), optional
        `dataplane_namespace`, `dataplane_local_writes` (None: stage through
        a local connection when on the actor's node; False: always through
        the actor; True: insist), `ledger_sync` ("normal"), `fail_stage_rate`
        (0.0), `seed` (0).
        """
        allowed = {"ledger_path", "dataplane_path", "dataplane_actor", "dataplane_namespace",
                   "dataplane_local_writes", "ledger_sync", "fail_stage_rate", "seed"}
        unknown = sorted(set(cfg) - allowed)
        if unknown:
            raise ValueError(f"capture sink config: unknown key {unknown[0]!r} (allowed: {sorted(allowed)})")
        if not cfg.get("ledger_path"):
            raise ValueError("capture sink config: 'ledger_path' is required")
        path, actor = cfg.get("dataplane_path"), cfg.get("dataplane_actor")
        if bool(path) == bool(actor):
            raise ValueError("capture sink config: give exactly one of 'dataplane_path' and 'dataplane_actor'")
        if actor:
            from harness.dataplane.actor import DataPlaneClient

            # local_writes=None: on the actor's node the sink stages through its own
            # connection to the same file (no round trip); elsewhere through the actor.
            dataplane: Any = DataPlaneClient(actor, namespace=cfg.get("dataplane_namespace"),
                                             local_writes=cfg.get("dataplane_local_writes"))
        else:
            from harness.dataplane.store import DataPlaneStore

            dataplane = DataPlaneStore(path)
        return cls(dataplane, CaptureLedger(cfg["ledger_path"]), fail_stage_rate=cfg.get("fail_stage_rate", 0.0),
                   seed=cfg.get("seed", 0), ledger_sync=cfg.get("ledger_sync", "normal"))

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
            what = f"item {index} ({_item_name(items[index][0])})" if index is not None else f"a batch of {len(items)}"
            raise CaptureBeginError(f"capture could not begin {what}: {type(cause).__name__}: {cause}",
                                    index) from cause

    def _begin_parsed(self, parsed: list[tuple[CaptureAdmission, list[int]]],
                      weight_version: int | None) -> list[_Pending]:
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
        pendings: list[_Pending] = []
        failures: list[CallRecord] = []
        for i, ((adm, prompt), seq) in enumerate(zip(parsed, seqs)):
            pending = _Pending(adm, prompt, weight_version, (adm.staging_key,), seq)
            if outcomes[i] is not None:
                # The call already has an outcome; it stands, this request is not captured.
                pending.failure_reason = "duplicate_call_id"
            elif adm.mode == "token_in":
                why, chain = self._check_lineage(adm, prompt, parent_of[i])
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

    def _prepare(self, pending: _Pending, output_ids: Sequence[int], logprobs: Any,
                 weight_version: int | None) -> _Finish:
        """Validate one finished request and build its staged row (no I/O)."""
        adm = pending.admission
        call = _Finish(pending, weight_version, pending.admission_epoch)
        if pending.failure_reason is not None:  # its failure row was written at begin_request
            call.reason, call.prewritten = pending.failure_reason, True
            return call
        epoch = pending.admission_epoch if pending.admission_epoch is not None else weight_version
        call.epoch = epoch
        if epoch is not None and weight_version is not None and weight_version != epoch:
            self.epoch_span_count += 1
            log.warning("capture: request %s spans a refit (admitted at weight version %s, finished at %s); "
                        "keeping the admission epoch", adm.staging_key, epoch, weight_version)
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
            if self.fail_stage_rate > 0.0 and unit_interval(self.seed, adm.staging_key) < self.fail_stage_rate:
                self.injected_failures += 1
                raise InjectedStagingFailure(f"injected staging failure for {adm.staging_key}")
        except Exception as exc:  # noqa: BLE001 - a capture problem fails the call, never the engine
            call.reason = f"stage_failed:{error_name(exc)}"
            return call
        call.output = output
        return call

    def _stage(self, calls: list[_Finish]) -> None:
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

    def _commit(self, calls: list[_Finish]) -> None:
        """Write the ledger outcomes of a staged batch in one transaction."""
        for c in calls:
            if c.reason is None:
                c.record = self._committed_record(c)
        batch = [c for c in calls if not c.prewritten]
        outcomes = self._write_outcomes([c.record if c.record is not None else self._failure_record(c)
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
            for err in self._write_outcomes([self._failure_record(c) for c in refused]):
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

    def _committed_record(self, c: _Finish) -> CallRecord:
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

    @staticmethod
    def _failure_record(c: _Finish) -> CallRecord:
        adm = c.pending.admission
        return CallRecord(rollout_id=adm.rollout_id, model_call_id=adm.model_call_id, status="failed",
                          parent_call_id=adm.parent_call_id, admission_seq=c.pending.admission_seq,
                          failure_reason=c.reason)

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
                call = _Finish(pending, None, pending.admission_epoch)
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

    def _check_lineage(self, adm: CaptureAdmission, prompt: list[int], parent: CallRecord | None
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

    @staticmethod
    def _failed_coords(adm: CaptureAdmission, reason: str, epoch: int | None, version: int | None) -> dict[str, Any]:
        return CommitCoords(
            rollout_id=adm.rollout_id, model_call_id=adm.model_call_id, disposition="capture_failed",
            prev_len=adm.prev_len, delta_len=0, cum_len=adm.prev_len, admission_epoch=epoch,
            weight_version=version, failure_reason=reason,
        ).to_dict()


def capture_config_from_spec(spec: Workload, run_dir: str | Path, *,
                             dataplane_actor: str | None = None) -> dict[str, Any]:
    """The `CaptureSink.from_config` dict for a run directory (design.md layout)."""
    run_dir = Path(run_dir)
    cfg: dict[str, Any] = {
        "ledger_path": str(run_dir / "ledger.sqlite"),
        "fail_stage_rate": spec.capture.fail_stage_rate,
        "seed": spec.seed,
    }
    if dataplane_actor:
        cfg["dataplane_actor"] = dataplane_actor
    else:
        cfg["dataplane_path"] = str(run_dir / "dataplane.sqlite")
    return cfg
