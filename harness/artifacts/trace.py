"""Per-rank trace artifacts: an append-only JSON Lines record stream.

Format (docs/design.md "Trace artifact format"): one JSON object per line,
each line terminated by ``\\n``. Every record has

* ``type``: ``header`` (always first, seq 0) | ``event`` | ``phase`` | ``close``;
* ``seq``: 0, 1, 2, ... with no gaps;
* ``crc``: first 16 hex digits of sha256 over :func:`canonical_json` of the
  record without its ``crc`` key.

Invariants the writer keeps and the reader checks: a crash can only damage the
*last* line (the writer appends and flushes whole lines), so an unterminated,
unparsable or crc-failing last line is a *torn* record (the rank died while
writing); anything wrong before the last line, or a ``seq`` gap, is
corruption. Pure: no torch, no ray (postflight reads traces with this module).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECORD_TYPES = ("header", "event", "phase", "close")
HEADER_FIELDS = ("role", "rank", "run_id", "pid", "profiler", "harness_version")
CRC_HEX_DIGITS = 16


class TraceFormatError(ValueError):
    """A record handed to :class:`TraceWriter` breaks the format."""


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept, NaN/inf refused."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def record_crc(record: dict[str, Any]) -> str:
    """The ``crc`` of ``record`` (computed over every key except ``crc``)."""
    body = {k: v for k, v in record.items() if k != "crc"}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()[:CRC_HEX_DIGITS]


class TraceWriter:
    """Append-only writer of one trace file.

    The header record is written by the constructor. ``write`` appends one
    line and flushes it to the OS (a crashed process leaves whole lines
    behind, except possibly a torn last one); ``flush(fsync=True)`` makes it
    durable and is called at every step end. The file must not exist yet: a
    trace is never appended to across processes.
    """

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.path = Path(path)
        missing = [k for k in HEADER_FIELDS if k not in header]
        if missing:
            raise TraceFormatError(f"trace header for {self.path} is missing field(s): {', '.join(missing)}")
        if header["role"] not in ("policy", "rollout", "teacher"):
            raise TraceFormatError(f"trace header field 'role' must be policy|rollout|teacher, got {header['role']!r}")
        if isinstance(header["rank"], bool) or not isinstance(header["rank"], int) or header["rank"] < 0:
            raise TraceFormatError(f"trace header field 'rank' must be a non-negative int, got {header['rank']!r}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._file = open(self.path, "x", encoding="utf-8", newline="\n")  # noqa: SIM115 - held until close()
        except FileExistsError:
            raise FileExistsError(f"trace file already exists (one writer per rank and run): {self.path}") from None
        self._next_seq = 0
        self._append({**header, "type": "header"})

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        """Append ``record`` (type event|phase|close); returns it with seq and crc."""
        rtype = record.get("type")
        if rtype not in RECORD_TYPES or rtype == "header":
            raise TraceFormatError(f"trace record field 'type' must be event|phase|close, got {rtype!r} ({self.path})")
        if "seq" in record or "crc" in record:
            raise TraceFormatError(f"trace record must not set 'seq' or 'crc' itself ({self.path})")
        return self._append(dict(record))

    def _append(self, record: dict[str, Any]) -> dict[str, Any]:
        if self._file.closed:
            raise ValueError(f"trace writer is closed: {self.path}")
        record["seq"] = self._next_seq
        try:
            record["crc"] = record_crc(record)
            line = canonical_json(record)
        except (TypeError, ValueError) as exc:
            raise TraceFormatError(
                f"trace record seq {self._next_seq} is not JSON-serialisable ({self.path}): {exc}"
            ) from exc
        self._file.write(line + "\n")
        self._file.flush()
        self._next_seq += 1
        return record

    def flush(self, fsync: bool = True) -> None:
        """Flush to the OS and, with ``fsync``, to stable storage."""
        if self._file.closed:
            return
        self._file.flush()
        if fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """fsync and close; idempotent. Writes no record (the profiler writes ``close``)."""
        if self._file.closed:
            return
        try:
            self.flush(fsync=True)
        finally:
            self._file.close()


@dataclass
class TraceFile:
    """A parsed trace. ``records`` excludes the header; bad lines are dropped."""

    path: str
    header: dict[str, Any] | None
    records: list[dict[str, Any]]
    torn: bool
    problems: list[str] = field(default_factory=list)

    @property
    def closed(self) -> bool:
        """The profiler wrote its ``close`` record last."""
        return bool(self.records) and self.records[-1].get("type") == "close"

    @property
    def complete(self) -> bool:
        """Header present, cleanly closed, nothing torn or corrupt."""
        return self.header is not None and self.closed and not self.torn and not self.problems

    def of_type(self, rtype: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("type") == rtype]


def _parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None) or (None, what is wrong)."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"unparsable JSON ({exc})"
    if not isinstance(record, dict):
        return None, f"record is a {type(record).__name__}, not an object"
    crc = record.get("crc")
    if not isinstance(crc, str) or crc != record_crc(record):
        return None, f"crc mismatch (stored {crc!r})"
    if record.get("type") not in RECORD_TYPES:
        return None, f"unknown record type {record.get('type')!r}"
    seq = record.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int):
        return None, f"field 'seq' is not an int ({seq!r})"
    return record, None


def read_trace(path: str | os.PathLike[str]) -> TraceFile:
    """Parse a trace file, classifying damage instead of raising.

    Raises only for an unreadable file (``OSError``). Problems are strings
    of the form ``"<path>:<line>: <what>"`` (1-based line numbers).
    """
    path_str = str(path)
    data = Path(path).read_bytes()
    problems: list[str] = []
    records: list[dict[str, Any]] = []
    header: dict[str, Any] | None = None
    torn = False
    if not data:
        return TraceFile(path_str, None, [], False, [f"{path_str}:1: empty trace (no header)"])

    lines = data.split(b"\n")
    terminated = lines[-1] == b""
    if terminated:
        lines = lines[:-1]
    last_index = len(lines) - 1
    expected_seq = 0
    for index, raw in enumerate(lines):
        lineno = index + 1
        is_last = index == last_index
        if is_last and not terminated:
            torn = True
            problems.append(f"{path_str}:{lineno}: torn record (unterminated last line)")
            continue
        record, error = _parse_line(raw)
        if error is not None:
            if is_last:
                torn = True
                problems.append(f"{path_str}:{lineno}: torn record ({error})")
            else:
                problems.append(f"{path_str}:{lineno}: corrupt record ({error})")
            continue
        assert record is not None
        if record["seq"] != expected_seq:
            problems.append(f"{path_str}:{lineno}: seq gap: expected {expected_seq}, found {record['seq']}")
        expected_seq = record["seq"] + 1
        if record["type"] == "header":
            if index == 0 and header is None:
                header = record
            else:
                problems.append(f"{path_str}:{lineno}: header record not on line 1")
            continue
        if index == 0:
            problems.append(f"{path_str}:1: first record is {record['type']!r}, not the header")
        records.append(record)
    if header is None and not any("not the header" in p for p in problems):
        problems.append(f"{path_str}:1: missing header record")
    return TraceFile(path_str, header, records, torn, problems)
