"""``StagingDB``: the data plane's durable key/row database over SQLite (staged token rows,
bulk tensors).

Contract:
  * `stage(key, row)` returns only after the row is committed with
    `journal_mode=WAL` and `synchronous=FULL`, i.e. after fsync: a process
    killed right after `stage` returns loses nothing.
  * A row is stored as its canonical JSON bytes together with their sha256.
    `fetch` recomputes the digest from the stored bytes and refuses a mismatch
    (`DigestMismatch` names the key), so on-disk tampering is detected.
  * Staging is idempotent for identical bytes and refuses different bytes under
    an existing key (`StagingConflict`): a staged row never changes.
  * Group commit: `stage_many(items)` stages a batch of rows in ONE
    transaction (one fsync) and returns one outcome per row, in order: the
    digest, or the exception that row raised (bad key, non-JSON or non-finite
    row, conflict). A bad row is isolated -- it is left out and the others
    commit. Every returned digest is durable when `stage_many` returns; if the
    transaction itself cannot commit, `stage_many` raises and nothing of the
    batch is staged.
  * Bulk tensors (`put_tensors`) live in their own table, stored as raw bytes
    with dtype and shape, digest-verified on read. Only these two methods
    import torch, lazily, so the row path stays light.

Many processes may open the same file (WAL: concurrent readers, one writer at a
time, `busy_timeout` waits for the lock).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from harness.dataplane.sqlite import open_durable

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rows (
    key     TEXT PRIMARY KEY,
    digest  TEXT NOT NULL,
    payload BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS tensors (
    key     TEXT PRIMARY KEY,
    digest  TEXT NOT NULL,
    meta    TEXT NOT NULL,
    payload BLOB NOT NULL
);
"""


class DataPlaneError(RuntimeError):
    """Base class of data-plane errors; messages always name the key."""


class DigestMismatch(DataPlaneError):
    """Stored bytes no longer hash to the digest recorded at staging time."""


class StagingConflict(DataPlaneError):
    """A key was re-staged with different bytes."""


def _check_finite(value: Any, key: str, path: str) -> None:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"data plane row {key!r}: field {path} holds non-finite {value!r}")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _check_finite(v, key, f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"data plane row {key!r}: field {path}[{i}] holds non-finite {v!r}")
            if isinstance(v, (Mapping, list, tuple)):
                _check_finite(v, key, f"{path}[{i}]")


def canonical_row_bytes(key: str, row: Mapping[str, Any]) -> bytes:
    """Canonical JSON of a row: sorted keys, no whitespace, NaN/inf refused."""
    if not isinstance(row, Mapping):
        raise TypeError(f"data plane row {key!r}: expected a mapping, got {type(row).__name__}")
    try:
        text = json.dumps(row, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError:
        _check_finite(row, key, "")
        raise
    except TypeError as exc:
        raise TypeError(f"data plane row {key!r}: not JSON-serialisable ({exc})") from None
    return text.encode()


def validate_key(key: str) -> None:
    """Keys are `<rollout_id>/<model_call_id>` for capture rows; any non-empty
    string without NUL is accepted (bulk tensor keys use their own prefixes)."""
    if not isinstance(key, str) or not key or "\x00" in key:
        raise ValueError(f"data plane key must be a non-empty string without NUL, got {key!r}")


class StagingDB:
    """SQLite-backed durable store. One instance per process; not thread-safe."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._db = open_durable(self.path, _SCHEMA)

    # -- rows ------------------------------------------------------------
    def stage(self, key: str, row: Mapping[str, Any]) -> str:
        """Durably store `row` under `key`; return the sha256 of its canonical bytes."""
        validate_key(key)
        payload = canonical_row_bytes(key, row)
        digest = hashlib.sha256(payload).hexdigest()
        with _immediate(self._db):
            existing = self._db.execute("SELECT digest FROM rows WHERE key=?", (key,)).fetchone()
            if existing is not None:
                if existing[0] != digest:
                    raise StagingConflict(
                        f"data plane key {key!r} already staged with digest {existing[0][:16]}..., "
                        f"refusing different bytes (digest {digest[:16]}...)"
                    )
                return digest
            self._db.execute("INSERT INTO rows(key, digest, payload) VALUES (?,?,?)", (key, digest, payload))
        return digest

    def stage_many(self, items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str | Exception]:
        """Stage `(key, row)` pairs in one durable transaction (group commit).

        Returns, per item and in order, the row digest (durable on return) or
        the exception that item raised (`ValueError`/`TypeError` for a bad key
        or row, `StagingConflict`); failed items are not staged, the others
        are. A duplicate key inside the batch behaves as two `stage` calls in
        a row. Raises (staging nothing) only if the transaction fails.
        """
        outcomes: list[str | Exception] = []
        prepared: list[tuple[int, str, str, bytes]] = []
        for i, item in enumerate(items):
            try:
                key, row = item
                validate_key(key)
                payload = canonical_row_bytes(key, row)
            except (TypeError, ValueError) as exc:
                outcomes.append(exc)
                continue
            outcomes.append("")
            prepared.append((i, key, hashlib.sha256(payload).hexdigest(), payload))
        if not prepared:
            return outcomes
        with _immediate(self._db):
            for i, key, digest, payload in prepared:
                inserted = self._db.execute(
                    "INSERT INTO rows(key, digest, payload) VALUES (?,?,?) ON CONFLICT(key) DO NOTHING",
                    (key, digest, payload),
                ).rowcount
                if inserted:
                    outcomes[i] = digest
                    continue
                existing = self._db.execute("SELECT digest FROM rows WHERE key=?", (key,)).fetchone()
                if existing[0] == digest:
                    outcomes[i] = digest
                else:
                    outcomes[i] = StagingConflict(
                        f"data plane key {key!r} already staged with digest {existing[0][:16]}..., "
                        f"refusing different bytes (digest {digest[:16]}...)"
                    )
        return outcomes

    def fetch(self, key: str) -> dict[str, Any]:
        """Return the row, after verifying its stored digest."""
        got = self._db.execute("SELECT digest, payload FROM rows WHERE key=?", (key,)).fetchone()
        if got is None:
            raise KeyError(f"data plane has no row under key {key!r}")
        return _decode_verified(key, got[0], got[1])

    def fetch_many(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        """`fetch` of every key, in order (each digest verified); raises on the
        first bad key. One query per 500 distinct keys."""
        keys = list(keys)
        found: dict[str, tuple[str, bytes]] = {}
        distinct = list(dict.fromkeys(keys))
        for i in range(0, len(distinct), 500):
            chunk = distinct[i:i + 500]
            rows = self._db.execute(
                f"SELECT key, digest, payload FROM rows WHERE key IN ({','.join('?' * len(chunk))})", chunk
            ).fetchall()
            found.update((k, (d, p)) for k, d, p in rows)
        out = []
        for k in keys:
            got = found.get(k)
            if got is None:
                raise KeyError(f"data plane has no row under key {k!r}")
            out.append(_decode_verified(k, got[0], got[1]))
        return out

    def digest(self, key: str) -> str | None:
        got = self._db.execute("SELECT digest FROM rows WHERE key=?", (key,)).fetchone()
        return None if got is None else got[0]

    def has(self, key: str) -> bool:
        return self._db.execute("SELECT 1 FROM rows WHERE key=?", (key,)).fetchone() is not None

    def keys(self, prefix: str = "") -> list[str]:
        """Sorted keys starting with `prefix` (a literal prefix, not a pattern)."""
        rows = self._db.execute(
            "SELECT key FROM rows WHERE substr(key, 1, ?) = ? ORDER BY key", (len(prefix), prefix)
        ).fetchall()
        return [r[0] for r in rows]

    # -- bulk tensors ----------------------------------------------------
    def put_tensors(self, key: str, tensors: Mapping[str, Any]) -> str:
        """Durably store a dict of tensors (bytes + dtype + shape) under `key`."""
        from harness.dataplane.tensors import encode_tensors

        validate_key(key)
        meta, payload = encode_tensors(key, tensors)
        meta_text = json.dumps(meta, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(meta_text.encode() + b"\x00" + payload).hexdigest()
        with _immediate(self._db):
            existing = self._db.execute("SELECT digest FROM tensors WHERE key=?", (key,)).fetchone()
            if existing is not None:
                if existing[0] != digest:
                    raise StagingConflict(f"data plane tensor key {key!r} already staged with other bytes")
                return digest
            self._db.execute(
                "INSERT INTO tensors(key, digest, meta, payload) VALUES (?,?,?,?)", (key, digest, meta_text, payload)
            )
        return digest

    def get_tensors(self, key: str) -> dict[str, Any]:
        from harness.dataplane.tensors import decode_tensors

        got = self._db.execute("SELECT digest, meta, payload FROM tensors WHERE key=?", (key,)).fetchone()
        if got is None:
            raise KeyError(f"data plane has no tensors under key {key!r}")
        digest, meta_text, payload = got
        payload = payload.encode() if isinstance(payload, str) else bytes(payload)
        if hashlib.sha256(meta_text.encode() + b"\x00" + payload).hexdigest() != digest:
            raise DigestMismatch(f"data plane tensors under key {key!r}: digest mismatch (stored bytes changed)")
        return decode_tensors(key, json.loads(meta_text), payload)

    def tensor_keys(self, prefix: str = "") -> list[str]:
        rows = self._db.execute(
            "SELECT key FROM tensors WHERE substr(key, 1, ?) = ? ORDER BY key", (len(prefix), prefix)
        ).fetchall()
        return [r[0] for r in rows]

    def delete_prefix(self, prefix: str) -> int:
        """Drop rows and tensors under `prefix` (trainer clean-up of consumed steps)."""
        if not prefix:
            raise ValueError("delete_prefix needs a non-empty prefix")
        with _immediate(self._db):
            n = self._db.execute("DELETE FROM rows WHERE substr(key, 1, ?) = ?", (len(prefix), prefix)).rowcount
            n += self._db.execute("DELETE FROM tensors WHERE substr(key, 1, ?) = ?", (len(prefix), prefix)).rowcount
        return n

    # -- checkpoints -----------------------------------------------------
    def snapshot(self, dest: str | os.PathLike[str]) -> None:
        """Write a consistent copy of the whole store to `dest` (sqlite backup API)."""
        _backup(self._db, dest)

    @classmethod
    def restore(cls, snapshot: str | os.PathLike[str], path: str | os.PathLike[str]) -> StagingDB:
        """Replace the store at `path` with `snapshot` and open it."""
        _restore_file(snapshot, path)
        return cls(path)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decode_verified(key: str, digest: str, payload: bytes | str) -> dict[str, Any]:
    # An external writer may have stored TEXT instead of a BLOB; hash what is there.
    payload = payload.encode() if isinstance(payload, str) else bytes(payload)
    actual = hashlib.sha256(payload).hexdigest()
    if actual != digest:
        raise DigestMismatch(
            f"data plane row {key!r}: digest mismatch (recorded {digest[:16]}..., recomputed {actual[:16]}...)"
        )
    return json.loads(payload)


class _immediate:
    """`BEGIN IMMEDIATE ... COMMIT` (ROLLBACK on error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.db.execute("ROLLBACK" if exc_type is not None else "COMMIT")


def _backup(db: sqlite3.Connection, dest: str | os.PathLike[str]) -> None:
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        tmp.unlink()
    out = sqlite3.connect(str(tmp))
    try:
        db.backup(out)
        out.execute("PRAGMA journal_mode=DELETE")
    finally:
        out.close()
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, dest)


def _restore_file(snapshot: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    snapshot, path = Path(snapshot), Path(path)
    if not snapshot.is_file():
        raise FileNotFoundError(f"snapshot {snapshot} does not exist")
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.unlink()
    tmp = path.with_name(path.name + ".restore")
    shutil.copyfile(snapshot, tmp)
    os.replace(tmp, path)
