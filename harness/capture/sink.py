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

Thread-safe (one lock); blocking (each finish fsyncs twice).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from harness.capture.digests import chain_hash, cumulative_hash, unit_interval
from harness.capture.ledger import CaptureLedger
from harness.capture.records import (
    CallRecord,
    CaptureAdmission,
    CaptureValidationError,
    CommitCoords,
    StagedCall,
)

log = logging.getLogger(__name__)


class InjectedStagingFailure(RuntimeError):
    """Raised by the fault injector in place of a real staging error."""


@dataclass
class _Pending:
    admission: CaptureAdmission
    prompt_ids: list[int]
    admission_epoch: int | None
    staging_chain: tuple[str, ...]
    failure_reason: str | None = None


class CaptureSink:
    """Stages token deltas and writes ledger rows for one engine owner."""

    def __init__(self, dataplane: Any, ledger: CaptureLedger, *, fail_stage_rate: float = 0.0, seed: int = 0):
        if not 0.0 <= float(fail_stage_rate) <= 1.0:
            raise ValueError(f"capture.fail_stage_rate must be in [0, 1], got {fail_stage_rate!r}")
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
    def from_config(cls, cfg: dict[str, Any]) -> "CaptureSink":
        """Build from plain config (works inside a Ray actor).

        Keys: `ledger_path` (required), exactly one of `dataplane_path` /
        `dataplane_actor` (a named `DataPlaneActor`), optional
        `dataplane_namespace`, `fail_stage_rate` (0.0), `seed` (0).
        """
        allowed = {"ledger_path", "dataplane_path", "dataplane_actor", "dataplane_namespace", "fail_stage_rate",
                   "seed"}
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

            dataplane: Any = DataPlaneClient(actor, namespace=cfg.get("dataplane_namespace"))
        else:
            from harness.dataplane.store import DataPlaneStore

            dataplane = DataPlaneStore(path)
        return cls(dataplane, CaptureLedger(cfg["ledger_path"]),
                   fail_stage_rate=cfg.get("fail_stage_rate", 0.0), seed=cfg.get("seed", 0))

    # -- request lifecycle -------------------------------------------------
    def begin_request(self, admission: dict[str, Any], prompt_ids: Sequence[int], *,
                      weight_version: int | None = None) -> str:
        """Validate the admission against the ledger; return an opaque handle."""
        with self._lock:
            adm = self._parse_admission(admission)
            handle = adm.staging_key
            if handle in self._pending:
                raise ValueError(f"capture request {handle!r} is already in flight")
            prompt = [int(t) for t in prompt_ids]
            if self.ledger.admission_seq(adm.rollout_id, adm.model_call_id) is None:
                self.ledger.admit(adm)  # engine-side admission (no trainer admitter in the loop)
            pending = _Pending(adm, prompt, weight_version, (handle,))
            if self.ledger.get(adm.rollout_id, adm.model_call_id) is not None:
                # The call already has an outcome; it stands, this request is not captured.
                self.failed += 1
                pending.failure_reason = "duplicate_call_id"
            else:
                if adm.mode == "token_in":
                    why, chain = self._check_lineage(adm, prompt)
                    pending.failure_reason = why
                    pending.staging_chain = chain + (handle,)
                if pending.failure_reason is not None:
                    self._write_failure(adm, pending.failure_reason)
            self._pending[handle] = pending
            return handle

    def finish_request(self, handle: str, output_ids: Sequence[int], logprobs: Any,
                       weight_version: int | None) -> dict[str, Any]:
        """Stage the delta durably, then commit; return token-free coords."""
        with self._lock:
            pending = self._pop(handle)
            adm = pending.admission
            if pending.failure_reason is not None:
                return self._failed_coords(adm, pending.failure_reason, pending.admission_epoch, weight_version)
            epoch = pending.admission_epoch if pending.admission_epoch is not None else weight_version
            if epoch is not None and weight_version is not None and weight_version != epoch:
                self.epoch_span_count += 1
                log.warning("capture: request %s spans a refit (admitted at weight version %s, finished at %s); "
                            "keeping the admission epoch", handle, epoch, weight_version)
            output = [int(t) for t in output_ids]
            lp = np.asarray(logprobs.detach().cpu() if hasattr(logprobs, "detach") else logprobs,
                            dtype=np.float32).reshape(-1)
            if lp.shape[0] != len(output):
                return self._fail(adm, f"logprobs_length_mismatch:{lp.shape[0]}!={len(output)}", epoch,
                                  weight_version)
            if not np.isfinite(lp).all():
                return self._fail(adm, "nonfinite_logprobs", epoch, weight_version)
            new_prompt = pending.prompt_ids[adm.prev_len:]
            delta_ids = new_prompt + output
            if not delta_ids:
                return self._fail(adm, "empty_delta", epoch, weight_version)
            mask = [0] * len(new_prompt) + [1] * len(output)
            delta_lp = np.concatenate([np.zeros(len(new_prompt), dtype=np.float32), lp])
            try:
                staged = StagedCall.build(handle, adm.prev_len, delta_ids, mask, delta_lp, epoch)
                if self.fail_stage_rate > 0.0 and unit_interval(self.seed, handle) < self.fail_stage_rate:
                    self.injected_failures += 1
                    raise InjectedStagingFailure(f"injected staging failure for {handle}")
                self.dataplane.stage(handle, staged.to_row())  # returns after the durable ack
            except Exception as exc:
                return self._fail(adm, f"stage_failed:{type(exc).__name__}", epoch, weight_version)
            parent_hash = adm.parent_chain_hash if adm.mode == "token_in" else None
            record = CallRecord(
                rollout_id=adm.rollout_id, model_call_id=adm.model_call_id, status="committed",
                parent_call_id=adm.parent_call_id,
                admission_seq=self.ledger.admission_seq(adm.rollout_id, adm.model_call_id),
                prev_len=adm.prev_len, delta_len=len(delta_ids), cum_len=adm.prev_len + len(delta_ids),
                output_len=len(output), digest=staged.digest, staging_key=handle,
                staging_chain=pending.staging_chain, chain_hash=chain_hash(parent_hash, staged.digest),
                cumulative_hash=cumulative_hash(pending.prompt_ids + output),
                admission_epoch=epoch, weight_version=weight_version,
            )
            try:
                self.ledger.record(record)
            except Exception as exc:
                return self._fail(adm, f"commit_failed:{type(exc).__name__}", epoch, weight_version)
            self.staged += 1
            return CommitCoords(
                rollout_id=adm.rollout_id, model_call_id=adm.model_call_id, disposition="staged",
                prev_len=record.prev_len, delta_len=record.delta_len, cum_len=record.cum_len,
                digest=record.digest, staging_key=handle, chain_hash=record.chain_hash,
                cumulative_hash=record.cumulative_hash, admission_epoch=epoch, weight_version=weight_version,
            ).to_dict()

    def abort_request(self, handle: str, reason: str) -> dict[str, Any]:
        """The engine gave up on the request: write a failure row."""
        with self._lock:
            pending = self._pop(handle)
            why = pending.failure_reason or f"aborted:{reason}"
            if pending.failure_reason is None:
                self._write_failure(pending.admission, why)
            return self._failed_coords(pending.admission, why, pending.admission_epoch, None)

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

    def _check_lineage(self, adm: CaptureAdmission, prompt: list[int]) -> tuple[str | None, tuple[str, ...]]:
        parent = self.ledger.get(adm.rollout_id, adm.parent_call_id or "")
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

    def _pop(self, handle: str) -> _Pending:
        try:
            return self._pending.pop(handle)
        except KeyError:
            raise KeyError(f"capture request {handle!r} is not in flight") from None

    def _write_failure(self, adm: CaptureAdmission, reason: str) -> None:
        self.failed += 1
        self.ledger.record_failure(adm.rollout_id, adm.model_call_id, reason, parent_call_id=adm.parent_call_id)

    def _fail(self, adm: CaptureAdmission, reason: str, epoch: int | None, version: int | None) -> dict[str, Any]:
        self._write_failure(adm, reason)
        return self._failed_coords(adm, reason, epoch, version)

    @staticmethod
    def _failed_coords(adm: CaptureAdmission, reason: str, epoch: int | None, version: int | None) -> dict[str, Any]:
        return CommitCoords(
            rollout_id=adm.rollout_id, model_call_id=adm.model_call_id, disposition="capture_failed",
            prev_len=adm.prev_len, delta_len=0, cum_len=adm.prev_len, admission_epoch=epoch,
            weight_version=version, failure_reason=reason,
        ).to_dict()


def capture_config_from_spec(spec: dict[str, Any], run_dir: str | Path, *,
                             dataplane_actor: str | None = None) -> dict[str, Any]:
    """The `CaptureSink.from_config` dict for a run directory (design.md layout)."""
    run_dir = Path(run_dir)
    cfg: dict[str, Any] = {
        "ledger_path": str(run_dir / "ledger.sqlite"),
        "fail_stage_rate": float(spec["capture"]["fail_stage_rate"]),
        "seed": int(spec["seed"]),
    }
    if dataplane_actor:
        cfg["dataplane_actor"] = dataplane_actor
    else:
        cfg["dataplane_path"] = str(run_dir / "dataplane.sqlite")
    return cfg
