"""Capture records and their validation rules (docs/capture.md).

Every record validates itself on construction and raises
`CaptureValidationError` naming the record type and field. `from_dict`
refuses unknown keys (the `extra="forbid"` of the upstream pydantic models).
Only `StagedCall` holds tokens; everything that goes to the ledger or over the
wire to the engine owner (`CaptureAdmission`, `CommitCoords`, `CallRecord`,
`RolloutReceipt`) is token-free, except the optional inline prefix of an
admission that has no staging chain.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from harness.capture.digests import delta_digest

MODES = ("text", "token_in")
DISPOSITIONS = ("staged", "capture_failed")
STATUSES = ("committed", "failed")
SELECTIONS = ("declared", "heuristic")
_BINARY = frozenset((0, 1))


class CaptureValidationError(ValueError):
    """A capture record broke a validation rule; the message names the field."""


def _fail(record: str, fieldname: str, why: str) -> None:
    raise CaptureValidationError(f"{record}.{fieldname}: {why}")


def staging_key(rollout_id: str, model_call_id: str) -> str:
    """The data-plane key of a call: `<rollout_id>/<model_call_id>`."""
    return f"{rollout_id}/{model_call_id}"


def _check_id(record: str, name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        _fail(record, name, f"must be a non-empty string, got {value!r}")
    if "/" in value and name != "staging_key":
        _fail(record, name, f"must not contain '/', got {value!r}")


class _Record:
    """Shared dict round-trip for the frozen dataclasses below."""

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for name in _field_names(type(self)):
            value = getattr(self, name)
            out[name] = _plain(value) if isinstance(value, (tuple, list, _Record)) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]):  # type: ignore[no-untyped-def]
        if not isinstance(data, dict):
            raise CaptureValidationError(f"{cls.__name__}: expected a dict, got {type(data).__name__}")
        names = _field_set(cls)
        if not names.issuperset(data):
            extra = sorted(set(data) - names)
            raise CaptureValidationError(f"{cls.__name__}.{extra[0]}: unknown field (allowed: {sorted(names)})")
        return cls(**data)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _field_set(cls: type) -> frozenset[str]:
    return frozenset(_field_names(cls))


def _plain(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, _Record):
        return value.to_dict()
    return value


@dataclass(frozen=True)
class CaptureAdmission(_Record):
    """Permission for one model call to be captured, and its lineage.

    text:     a parentless root; prev_len 0; no prefix, chain or parent hash.
    token_in: continues `parent_call_id`; prev_len > 0; parent_chain_hash set;
              `staging_chain` (parent's keys, root first) or an inline
              `required_prefix_token_ids` of length prev_len.
    """

    rollout_id: str
    model_call_id: str
    mode: Literal["text", "token_in"]
    parent_call_id: str | None = None
    prev_len: int = 0
    required_prefix_token_ids: tuple[int, ...] | None = None
    staging_chain: tuple[str, ...] | None = None
    parent_chain_hash: str | None = None
    admission_seq: int = 0

    def __post_init__(self) -> None:
        r = "CaptureAdmission"
        _check_id(r, "rollout_id", self.rollout_id)
        _check_id(r, "model_call_id", self.model_call_id)
        if self.required_prefix_token_ids is not None:
            object.__setattr__(self, "required_prefix_token_ids", tuple(int(t) for t in self.required_prefix_token_ids))
        if self.staging_chain is not None:
            object.__setattr__(self, "staging_chain", tuple(self.staging_chain))
        if not isinstance(self.prev_len, int) or self.prev_len < 0:
            _fail(r, "prev_len", f"must be an int >= 0, got {self.prev_len!r}")
        if not isinstance(self.admission_seq, int) or self.admission_seq < 0:
            _fail(r, "admission_seq", f"must be an int >= 0, got {self.admission_seq!r}")
        if self.mode == "text":
            if self.parent_call_id is not None:
                _fail(r, "parent_call_id", "a text-mode admission must be a parentless root")
            if self.prev_len != 0:
                _fail(r, "prev_len", f"a text-mode admission must have prev_len 0, got {self.prev_len}")
            if self.required_prefix_token_ids is not None:
                _fail(r, "required_prefix_token_ids", "a text-mode admission carries no prefix")
            if self.staging_chain is not None:
                _fail(r, "staging_chain", "a text-mode admission carries no staging chain")
            if self.parent_chain_hash is not None:
                _fail(r, "parent_chain_hash", "a text-mode admission carries no parent chain hash")
        elif self.mode == "token_in":
            if self.parent_call_id is None:
                _fail(r, "parent_call_id", "a token_in admission needs a parent")
            _check_id(r, "parent_call_id", self.parent_call_id)
            if self.prev_len <= 0:
                _fail(r, "prev_len", f"a token_in admission needs prev_len > 0, got {self.prev_len}")
            if not self.parent_chain_hash:
                _fail(r, "parent_chain_hash", "a token_in admission needs the parent's chain hash")
            if self.staging_chain:
                expected = staging_key(self.rollout_id, self.parent_call_id)
                if self.staging_chain[-1] != expected:
                    _fail(
                        r,
                        "staging_chain",
                        f"must end with the parent's key {expected!r}, got {self.staging_chain[-1]!r}",
                    )
            elif self.required_prefix_token_ids is None or len(self.required_prefix_token_ids) != self.prev_len:
                got = None if self.required_prefix_token_ids is None else len(self.required_prefix_token_ids)
                _fail(r, "required_prefix_token_ids",
                      f"without a staging_chain, must hold exactly prev_len={self.prev_len} tokens, got {got}")
        else:
            _fail(r, "mode", f"must be one of {MODES}, got {self.mode!r}")

    @property
    def staging_key(self) -> str:
        return staging_key(self.rollout_id, self.model_call_id)


@dataclass(frozen=True)
class CommitCoords(_Record):
    """What the engine owner returns per captured call (token-free)."""

    rollout_id: str
    model_call_id: str
    disposition: Literal["staged", "capture_failed"]
    prev_len: int
    delta_len: int
    cum_len: int
    digest: str | None = None
    staging_key: str | None = None
    chain_hash: str | None = None
    cumulative_hash: str | None = None
    admission_epoch: int | None = None
    weight_version: int | None = None
    failure_reason: str | None = None

    def __post_init__(self) -> None:
        r = "CommitCoords"
        _check_id(r, "rollout_id", self.rollout_id)
        _check_id(r, "model_call_id", self.model_call_id)
        if self.cum_len != self.prev_len + self.delta_len:
            _fail(r, "cum_len", f"{self.cum_len} != prev_len {self.prev_len} + delta_len {self.delta_len}")
        hashes = ("digest", "staging_key", "chain_hash", "cumulative_hash")
        if self.disposition == "staged":
            for name in hashes:
                if not getattr(self, name):
                    _fail(r, name, "required when disposition is 'staged'")
            if self.delta_len <= 0:
                _fail(r, "delta_len", "a staged call has a non-empty delta")
            if self.failure_reason is not None:
                _fail(r, "failure_reason", "must be None when disposition is 'staged'")
        elif self.disposition == "capture_failed":
            for name in hashes:
                if getattr(self, name) is not None:
                    _fail(r, name, "must be None when disposition is 'capture_failed'")
            if self.delta_len != 0:
                _fail(r, "delta_len", f"must be 0 when disposition is 'capture_failed', got {self.delta_len}")
            if not self.failure_reason:
                _fail(r, "failure_reason", "required when disposition is 'capture_failed'")
        else:
            _fail(r, "disposition", f"must be one of {DISPOSITIONS}, got {self.disposition!r}")


@dataclass(frozen=True)
class StagedCall(_Record):
    """The exact token delta of one call as staged in the data plane.

    Masks are 0/1; logprobs are float32 values and 0.0 wherever the mask is 0;
    `digest` must equal `delta_digest(ids, mask, logprobs)` (recomputed here).
    """

    staging_key: str
    prev_len: int
    token_ids_delta: tuple[int, ...]
    token_mask_delta: tuple[int, ...]
    generation_log_probs_delta: tuple[float, ...]
    digest: str
    weight_version: int | None = None

    def __post_init__(self) -> None:
        mask, lp = self._normalise_and_check()
        actual = delta_digest(self.token_ids_delta, mask, lp)
        if actual != self.digest:
            _fail(f"StagedCall[{self.staging_key}]", "digest",
                  f"recorded {self.digest[:16]}... but the delta hashes to {actual[:16]}...")

    def _normalise_and_check(self) -> tuple[np.ndarray, np.ndarray]:
        """Coerce to ints / float32-exact floats and enforce the row rules
        (vectorised: this runs for every staged and every fetched row).
        Returns the mask and logprobs as float32 arrays (for the digest)."""
        r = f"StagedCall[{self.staging_key}]"
        ids = tuple(map(int, self.token_ids_delta))
        masks = tuple(map(int, self.token_mask_delta))
        lp = np.asarray(self.generation_log_probs_delta, dtype=np.float32)
        object.__setattr__(self, "token_ids_delta", ids)
        object.__setattr__(self, "token_mask_delta", masks)
        object.__setattr__(self, "generation_log_probs_delta", tuple(lp.tolist()))
        n = len(ids)
        if n == 0:
            _fail(r, "token_ids_delta", "is empty")
        if len(masks) != n:
            _fail(r, "token_mask_delta", f"length {len(masks)} != {n} token ids")
        if len(lp) != n:
            _fail(r, "generation_log_probs_delta", f"length {len(lp)} != {n} token ids")
        if not _BINARY.issuperset(masks):
            i = next(i for i, m in enumerate(masks) if m not in _BINARY)
            _fail(r, "token_mask_delta", f"position {i} holds {masks[i]}, masks are 0/1")
        mask = np.array(masks, dtype=np.float32)
        bad = ~np.isfinite(lp) | ((mask == 0) & (lp != 0.0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            x = self.generation_log_probs_delta[i]
            if not math.isfinite(x):
                _fail(r, "generation_log_probs_delta", f"position {i} is not finite ({x})")
            _fail(r, "generation_log_probs_delta", f"position {i} is {x} where the mask is 0 (must be 0.0)")
        return mask, lp

    @classmethod
    def build(cls, staging_key: str, prev_len: int, token_ids: Sequence[int], mask: Sequence[int],
              logprobs: Sequence[float], weight_version: int | None = None) -> StagedCall:
        """A new staged call; its digest is computed here, once, from the
        normalised delta (prompt positions, mask 0, get logprob 0.0)."""
        lp = np.asarray(logprobs, dtype=np.float32)
        lp = np.where(np.asarray(mask) == 0, np.float32(0.0), lp).astype(np.float32)
        call = cls.__new__(cls)
        for name, value in (("staging_key", staging_key), ("prev_len", prev_len), ("token_ids_delta", token_ids),
                            ("token_mask_delta", mask), ("generation_log_probs_delta", lp),
                            ("weight_version", weight_version)):
            object.__setattr__(call, name, value)
        mask_f32, lp_f32 = call._normalise_and_check()
        object.__setattr__(call, "digest", delta_digest(call.token_ids_delta, mask_f32, lp_f32))
        return call

    def to_row(self) -> dict[str, Any]:
        """The data-plane row (same content as `to_dict`, built directly)."""
        return {"staging_key": self.staging_key, "prev_len": self.prev_len,
                "token_ids_delta": list(self.token_ids_delta), "token_mask_delta": list(self.token_mask_delta),
                "generation_log_probs_delta": list(self.generation_log_probs_delta), "digest": self.digest,
                "weight_version": self.weight_version}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StagedCall:
        return cls.from_dict(row)


@dataclass(frozen=True)
class CallRecord(_Record):
    """A ledger row (token-free). `committed` rows carry the staging coordinates;
    `failed` rows carry only ids and `failure_reason` and are never parents."""

    rollout_id: str
    model_call_id: str
    status: Literal["committed", "failed"]
    parent_call_id: str | None = None
    admission_seq: int | None = None
    prev_len: int = 0
    delta_len: int = 0
    cum_len: int = 0
    output_len: int = 0
    digest: str | None = None
    staging_key: str | None = None
    staging_chain: tuple[str, ...] = field(default_factory=tuple)
    chain_hash: str | None = None
    cumulative_hash: str | None = None
    admission_epoch: int | None = None
    weight_version: int | None = None
    failure_reason: str | None = None

    def __post_init__(self) -> None:
        r = f"CallRecord[{self.rollout_id}/{self.model_call_id}]"
        _check_id(r, "rollout_id", self.rollout_id)
        _check_id(r, "model_call_id", self.model_call_id)
        object.__setattr__(self, "staging_chain", tuple(self.staging_chain))
        if self.status == "committed":
            for name in ("digest", "staging_key", "chain_hash", "cumulative_hash"):
                if not getattr(self, name):
                    _fail(r, name, "required on a committed record")
            if self.cum_len != self.prev_len + self.delta_len:
                _fail(r, "cum_len", f"{self.cum_len} != prev_len {self.prev_len} + delta_len {self.delta_len}")
            if self.delta_len <= 0:
                _fail(r, "delta_len", "a committed call has a non-empty delta")
            if not self.staging_chain or self.staging_chain[-1] != self.staging_key:
                _fail(r, "staging_chain", "must end with the record's own staging key")
            if (self.parent_call_id is None) != (len(self.staging_chain) == 1):
                _fail(r, "staging_chain", "a root has a one-key chain; a continuation a longer one")
            if self.failure_reason is not None:
                _fail(r, "failure_reason", "must be None on a committed record")
        elif self.status == "failed":
            if not self.failure_reason:
                _fail(r, "failure_reason", "required on a failed record")
        else:
            _fail(r, "status", f"must be one of {STATUSES}, got {self.status!r}")

    @property
    def committed(self) -> bool:
        return self.status == "committed"


@dataclass(frozen=True)
class RolloutReceipt(_Record):
    """Token-free end-of-rollout statement: which call is the terminal one.

    Unpoisoned: terminal set, in the manifest and committed, selection set,
    no failure_reason. Poisoned: failure_reason set (terminal may be None).
    """

    rollout_id: str
    reward: float
    manifest: tuple[CallRecord, ...]
    terminal_model_call_id: str | None = None
    capture_poisoned: bool = False
    failure_reason: str | None = None
    terminal_selection: Literal["declared", "heuristic"] | None = None
    terminal_attribution_reason: str | None = None

    def __post_init__(self) -> None:
        r = f"RolloutReceipt[{self.rollout_id}]"
        _check_id(r, "rollout_id", self.rollout_id)
        manifest = tuple(c if isinstance(c, CallRecord) else CallRecord.from_dict(c) for c in self.manifest)
        object.__setattr__(self, "manifest", manifest)
        if not isinstance(self.reward, (int, float)) or not math.isfinite(self.reward):
            _fail(r, "reward", f"must be a finite number, got {self.reward!r}")
        ids = [c.model_call_id for c in manifest]
        if len(set(ids)) != len(ids):
            _fail(r, "manifest", f"model_call_ids are not unique: {ids}")
        for c in manifest:
            if c.rollout_id != self.rollout_id:
                _fail(r, "manifest", f"holds a call of rollout {c.rollout_id!r}")
        if self.terminal_selection is not None and self.terminal_selection not in SELECTIONS:
            _fail(r, "terminal_selection", f"must be one of {SELECTIONS} or None, got {self.terminal_selection!r}")
        if self.terminal_model_call_id is not None:
            by_id = {c.model_call_id: c for c in manifest}
            if self.terminal_model_call_id not in by_id:
                _fail(r, "terminal_model_call_id", f"{self.terminal_model_call_id!r} is not in the manifest")
            if not self.capture_poisoned and not by_id[self.terminal_model_call_id].committed:
                _fail(r, "terminal_model_call_id", "names a failed call")
        if self.capture_poisoned:
            if not self.failure_reason:
                _fail(r, "failure_reason", "required when the rollout is poisoned")
        else:
            if self.terminal_model_call_id is None:
                _fail(r, "terminal_model_call_id", "required when the rollout is not poisoned")
            if self.terminal_selection is None:
                _fail(r, "terminal_selection", "required when the rollout is not poisoned")
            if self.failure_reason is not None:
                _fail(r, "failure_reason", "must be None when the rollout is not poisoned")
