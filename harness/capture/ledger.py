"""The capture ledger: durable, token-free rows per model call (SQLite).

Tables:
  admissions  one row per admitted call (the `CaptureAdmission`, token-free
              form), numbered by a global `admission_seq` (admission order).
  calls       at most one outcome per call: `committed` (a `CallRecord`
              written only after the staged row was acknowledged durable) or
              `failed` (a poison row). An outcome is final: a committed call
              cannot later fail, a failed call can never commit, and a failed
              call is never resolved as a parent.

Every write is its own `BEGIN IMMEDIATE` transaction. Outcome rows commit
under `synchronous=FULL` (fsync before return) unless the writer asks for
`record_many(..., sync=False)` (the engine owner's sink does, see
docs/capture.md "Durability"); admission rows under NORMAL. A NORMAL commit
in WAL mode is visible at once and survives a process kill; an OS crash can
lose the newest NORMAL transactions (a consistent prefix survives).
Group commit: `record_many(records)` writes a batch of outcomes (committed
and failed) in ONE transaction, with per-record isolation -- a record that
breaks the outcome rules gets its `LedgerError` back and the rest commit.
Several processes may write (engine owners, the trainer's admitter).

Batch forms for the per-step loops (each one statement or one transaction,
whatever the batch size): `admit_many`, `get_many`, `admission_seqs`,
`manifests`, `admitted_call_ids`.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from harness.capture.records import CallRecord, CaptureAdmission, CaptureValidationError
from harness.dataplane.sqlite import open_durable
from harness.dataplane.staging_db import _backup, _immediate, _restore_file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS admissions (
    admission_seq INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id    TEXT NOT NULL,
    model_call_id TEXT NOT NULL,
    body          TEXT NOT NULL,
    UNIQUE (rollout_id, model_call_id)
);
CREATE TABLE IF NOT EXISTS calls (
    rollout_id    TEXT NOT NULL,
    model_call_id TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('committed', 'failed')),
    body          TEXT NOT NULL,
    PRIMARY KEY (rollout_id, model_call_id)
);
"""


_CHUNK = 400  # pairs per batched query (2 variables each; SQLite's floor is 999 variables)


class LedgerError(RuntimeError):
    """A ledger write broke the outcome rules; the message names the call."""


class CaptureLedger:
    """SQLite ledger of admissions and call outcomes. One instance per process."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._db = open_durable(self.path, _SCHEMA)
        # Admissions go through a second connection with synchronous=NORMAL: in
        # WAL mode such a commit survives a process kill (not a power loss) and
        # becomes fully durable at the next FULL commit on the file, i.e. no
        # later than the call's own outcome row. Saves one fsync per call.
        self._fast = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None, check_same_thread=False)
        self._fast.execute("PRAGMA synchronous=NORMAL")
        self._fast.execute("PRAGMA busy_timeout=30000")

    # -- writes ------------------------------------------------------------
    def admit(self, admission: CaptureAdmission) -> int:
        """Record an admission; return its `admission_seq` (the admission's own
        field is ignored and replaced). Re-admitting a call id is refused."""
        body = admission.to_dict()
        body.pop("required_prefix_token_ids", None)  # the ledger stays token-free
        with _immediate(self._fast):
            try:
                cur = self._fast.execute(
                    "INSERT INTO admissions(rollout_id, model_call_id, body) VALUES (?,?,?)",
                    (admission.rollout_id, admission.model_call_id, json.dumps(body, sort_keys=True)),
                )
            except sqlite3.IntegrityError:
                raise LedgerError(
                    f"call {admission.rollout_id}/{admission.model_call_id} was already admitted"
                ) from None
            return int(cur.lastrowid)

    def admit_many(self, admissions: Sequence[CaptureAdmission]) -> list[int]:
        """`admit` of every admission in ONE transaction; the `admission_seq`s,
        in order (the same numbers the admissions admitted one by one would
        get). All or nothing: a call admitted twice (before, or twice in the
        batch) raises `LedgerError` naming it and no admission of the batch is
        written."""
        if not admissions:
            return []
        seqs: list[int] = []
        with _immediate(self._fast):
            for adm in admissions:
                body = adm.to_dict()
                body.pop("required_prefix_token_ids", None)
                try:
                    cur = self._fast.execute(
                        "INSERT INTO admissions(rollout_id, model_call_id, body) VALUES (?,?,?)",
                        (adm.rollout_id, adm.model_call_id, json.dumps(body, sort_keys=True)),
                    )
                except sqlite3.IntegrityError:
                    raise LedgerError(f"call {adm.rollout_id}/{adm.model_call_id} was already admitted") from None
                seqs.append(int(cur.lastrowid))
        return seqs

    def record(self, call: CallRecord) -> None:
        """Write a committed row. Call only after the staged row is durable."""
        if not call.committed:
            raise LedgerError(
                f"record() takes committed rows; use record_failure for {call.rollout_id}/{call.model_call_id}"
            )
        self._write_outcome(call)

    def record_failure(self, rollout_id: str, model_call_id: str, reason: str, *,
                       parent_call_id: str | None = None, admission_seq: int | None = None) -> CallRecord:
        """Write a poison row. Idempotent for a call that already failed (the
        first reason is kept); refused for a committed call."""
        if admission_seq is None:
            admission_seq = self.admission_seq(rollout_id, model_call_id)
        row = CallRecord(rollout_id=rollout_id, model_call_id=model_call_id, status="failed",
                         parent_call_id=parent_call_id, admission_seq=admission_seq, failure_reason=reason)
        existing = self.get(rollout_id, model_call_id)
        if existing is not None and not existing.committed:
            return existing
        self._write_outcome(row)
        return row

    def record_many(self, calls: Sequence[CallRecord], *, sync: bool = True) -> list[LedgerError | None]:
        """Write a batch of outcomes in one transaction (group commit).

        Per record, in order: `None` (written, or already there: identical
        bytes, or a failure for an already-failed call, whose first reason is
        kept -- the rules of `record` / `record_failure`) or the `LedgerError`
        it broke (a different outcome exists), in which case that record is
        not written and the others are. The caller orders the batch after the
        durable acks of the staged rows its committed records point at. Raises
        (writing nothing) only if the transaction itself fails.

        `sync=True`: the commit is fsynced before return (`synchronous=FULL`).
        `sync=False`: `synchronous=NORMAL` -- visible to every reader at once
        and safe against a process kill; on an OS crash or power loss the
        newest ledger transactions can be lost (never reordered, never torn),
        which leaves their calls without an outcome, i.e. poisoned (see
        docs/capture.md, "Durability").
        """
        outcomes: list[LedgerError | None] = [None] * len(calls)
        if not calls:
            return outcomes
        bodies = [json.dumps(c.to_dict(), sort_keys=True) for c in calls]
        db = self._db if sync else self._fast
        with _immediate(db):
            for i, (call, body) in enumerate(zip(calls, bodies)):
                try:
                    self._insert_outcome(call, body, db)
                except LedgerError as exc:
                    outcomes[i] = exc
        return outcomes

    def _write_outcome(self, call: CallRecord) -> None:
        body = json.dumps(call.to_dict(), sort_keys=True)
        with _immediate(self._db):
            self._insert_outcome(call, body)

    def _insert_outcome(self, call: CallRecord, body: str, db: sqlite3.Connection | None = None) -> None:
        """Inside an open transaction on `db` (default: the FULL connection):
        insert `call` unless an outcome exists. An identical row, or a failure
        over a failure, is a no-op; anything else over an existing outcome
        raises `LedgerError` (nothing written)."""
        db = self._db if db is None else db
        inserted = db.execute(
            "INSERT INTO calls(rollout_id, model_call_id, status, body) VALUES (?,?,?,?) "
            "ON CONFLICT(rollout_id, model_call_id) DO NOTHING",
            (call.rollout_id, call.model_call_id, call.status, body),
        ).rowcount
        if inserted:
            return
        got = db.execute(
            "SELECT status, body FROM calls WHERE rollout_id=? AND model_call_id=?",
            (call.rollout_id, call.model_call_id),
        ).fetchone()
        if got[1] == body or (got[0] == "failed" and not call.committed):
            return
        raise LedgerError(
            f"call {call.rollout_id}/{call.model_call_id} already has outcome {got[0]!r}; "
            f"refusing to write {call.status!r}"
        )

    # -- reads -------------------------------------------------------------
    def get(self, rollout_id: str, model_call_id: str) -> CallRecord | None:
        got = self._db.execute(
            "SELECT body FROM calls WHERE rollout_id=? AND model_call_id=?", (rollout_id, model_call_id)
        ).fetchone()
        return None if got is None else _load_record(got[0])

    def get_many(self, calls: Sequence[tuple[str, str]]) -> list[CallRecord | None]:
        """`get` of every `(rollout_id, model_call_id)`, in order, in one query per 400 calls."""
        found = {(r, m): body for r, m, body in self._pairs("SELECT c.rollout_id, c.model_call_id, c.body FROM calls c",
                                                            "c", calls)}
        return [None if (b := found.get((r, m))) is None else _load_record(b) for r, m in calls]

    def admission_seqs(self, calls: Sequence[tuple[str, str]]) -> list[int | None]:
        """`admission_seq` of every `(rollout_id, model_call_id)`, in order."""
        found = {(r, m): seq for r, m, seq in self._pairs(
            "SELECT a.rollout_id, a.model_call_id, a.admission_seq FROM admissions a", "a", calls)}
        return [None if (s := found.get((r, m))) is None else int(s) for r, m in calls]

    def _pairs(self, select: str, alias: str, calls: Sequence[tuple[str, str]]) -> list[tuple[Any, ...]]:
        """Rows of `select` (whose table is `alias`) matching any of the
        (rollout_id, model_call_id) pairs; chunked under SQLite's variable limit."""
        out: list[tuple[Any, ...]] = []
        pairs = list(dict.fromkeys((str(r), str(m)) for r, m in calls))
        for i in range(0, len(pairs), _CHUNK):
            chunk = pairs[i:i + _CHUNK]
            values = ",".join(["(?,?)"] * len(chunk))
            sql = (f"WITH q(r, m) AS (VALUES {values}) {select} JOIN q "
                   f"ON {alias}.rollout_id = q.r AND {alias}.model_call_id = q.m")
            out.extend(self._db.execute(sql, [x for p in chunk for x in p]).fetchall())
        return out

    def admission_seq(self, rollout_id: str, model_call_id: str) -> int | None:
        got = self._db.execute(
            "SELECT admission_seq FROM admissions WHERE rollout_id=? AND model_call_id=?",
            (rollout_id, model_call_id),
        ).fetchone()
        return None if got is None else int(got[0])

    def admitted(self, rollout_id: str) -> list[CaptureAdmission]:
        rows = self._db.execute(
            "SELECT admission_seq, body FROM admissions WHERE rollout_id=? ORDER BY admission_seq", (rollout_id,)
        ).fetchall()
        out = []
        for seq, body in rows:
            data = json.loads(body)
            data["admission_seq"] = int(seq)
            out.append(CaptureAdmission.from_dict(data))
        return out

    def manifest(self, rollout_id: str) -> list[CallRecord]:
        """All outcomes of a rollout (committed and failed), in admission order
        (calls never admitted through this ledger sort last, by id)."""
        rows = self._db.execute("SELECT body FROM calls WHERE rollout_id=?", (rollout_id,)).fetchall()
        records = [_load_record(b) for (b,) in rows]
        big = 1 << 62
        records.sort(key=lambda c: (c.admission_seq if c.admission_seq is not None else big, c.model_call_id))
        return records

    def manifests(self, rollout_ids: Sequence[str]) -> dict[str, list[CallRecord]]:
        """`manifest` of every rollout (one query per 800 rollouts); every id is a key."""
        out: dict[str, list[CallRecord]] = {r: [] for r in rollout_ids}
        for rid, body in self._by_rollout("SELECT rollout_id, body FROM calls", out):
            out[rid].append(_load_record(body))
        big = 1 << 62
        for records in out.values():
            records.sort(key=lambda c: (c.admission_seq if c.admission_seq is not None else big, c.model_call_id))
        return out

    def admitted_call_ids(self, rollout_ids: Sequence[str]) -> dict[str, list[str]]:
        """The admitted call ids of every rollout, in admission order; every id is a key."""
        out: dict[str, list[str]] = {r: [] for r in rollout_ids}
        rows = self._by_rollout("SELECT rollout_id, admission_seq, model_call_id FROM admissions", out)
        for rid, _, cid in sorted(rows, key=lambda row: row[1]):
            out[rid].append(cid)
        return out

    def _by_rollout(self, select: str, rollout_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        ids = list(rollout_ids)
        out: list[tuple[Any, ...]] = []
        for i in range(0, len(ids), 2 * _CHUNK):
            chunk = ids[i:i + 2 * _CHUNK]
            out.extend(self._db.execute(f"{select} WHERE rollout_id IN ({','.join('?' * len(chunk))})",
                                        chunk).fetchall())
        return out

    def rollout_ids(self) -> list[str]:
        rows = self._db.execute(
            "SELECT rollout_id FROM admissions UNION SELECT rollout_id FROM calls ORDER BY rollout_id"
        ).fetchall()
        return [r[0] for r in rows]

    # -- checkpoints -------------------------------------------------------
    def snapshot(self, dest: str | os.PathLike[str]) -> None:
        _backup(self._db, dest)

    @classmethod
    def restore(cls, snapshot: str | os.PathLike[str], path: str | os.PathLike[str]) -> CaptureLedger:
        _restore_file(snapshot, path)
        return cls(path)

    def close(self) -> None:
        self._fast.close()
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _load_record(body: str) -> CallRecord:
    data: dict[str, Any] = json.loads(body)
    try:
        return CallRecord.from_dict(data)
    except CaptureValidationError as exc:
        raise LedgerError(f"ledger row is invalid: {exc}") from None
