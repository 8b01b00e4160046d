"""What every SQLite commit of this process does, seen from the connection itself.

``CommitObserver.install(set_attr)`` wraps ``sqlite3.connect``: every
connection opened afterwards (the data plane's, both of the ledger's, a
snapshot's) gets a trace callback (``Connection.set_trace_callback``), which
SQLite calls as it starts each statement, with the bound values written in.
At every ``COMMIT`` -- and at a write outside any transaction, which commits
by itself -- the callback reads that connection's ``PRAGMA synchronous`` and
``PRAGMA journal_mode``: the settings the commit runs under. (SQLite refuses
to change ``synchronous`` inside a transaction, so the level read as COMMIT
starts is the level it commits at.) In WAL mode SQLite syncs the WAL at a
commit at ``FULL`` (2) or ``EXTRA`` (3), not at ``NORMAL`` (1) or ``OFF`` (0).

``durability_problems(commits, ledger_sync)`` checks the contract of
docs/capture.md ("Durability") over what was observed, and
``run_turns`` drives real capture batches (admitter, sink, both stores) for
the tests.
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FULL, NORMAL, OFF = 2, 1, 0
LEVEL_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")
_ROW_KEY = re.compile(r"^INSERT INTO rows\(key, digest, payload\) VALUES \('((?:[^']|'')*)'")
_OUTCOME = re.compile(r"^INSERT INTO calls\(rollout_id, model_call_id, status, body\) VALUES "
                      r"\('(?:[^']|'')*','(?:[^']|'')*','(committed|failed)','((?:[^']|'')*)'\)")


@dataclass
class Commit:
    """One committed transaction on one connection."""

    file: str                 # the database file's name, e.g. "dataplane.sqlite"
    connection: int           # serial of the connection within the observer
    begin: int                # statement number of its BEGIN (the write itself for an autocommit write)
    end: int                  # statement number of its COMMIT
    synchronous: int          # PRAGMA synchronous as the COMMIT started
    journal_mode: str
    writes: list[str] = field(default_factory=list)

    def staged_keys(self) -> list[str]:
        """Data-plane row keys this commit inserted (or re-staged)."""
        return [m.group(1).replace("''", "'") for w in self.writes if (m := _ROW_KEY.match(w))]

    def outcomes(self) -> list[tuple[str, dict[str, Any]]]:
        """Ledger outcome rows (status, record body) this commit wrote."""
        return [(m.group(1), json.loads(m.group(2).replace("''", "'"))) for w in self.writes
                if (m := _OUTCOME.match(w))]

    def describe(self) -> str:
        return (f"{self.file} commit (statements {self.begin}..{self.end}) at "
                f"synchronous={LEVEL_NAMES.get(self.synchronous, self.synchronous)}, journal_mode={self.journal_mode}")


class CommitObserver:
    """Records every statement and commit of the connections opened after ``install``."""

    def __init__(self) -> None:
        self.commits: list[Commit] = []
        self.statements: list[tuple[str, str]] = []   # (file, statement), in the order SQLite started them
        self._count = itertools.count()
        self._serial = itertools.count()

    def install(self, set_attr: Callable[[Any, str, Any], None]) -> CommitObserver:
        real = sqlite3.connect

        def connect(database, *args, **kwargs):
            db = real(database, *args, **kwargs)
            self.watch(db, Path(str(database)).name)
            return db

        set_attr(sqlite3, "connect", connect)
        return self

    def mark(self) -> int:
        """Position in ``commits`` (slice the commits of one operation between two marks)."""
        return len(self.commits)

    def watch(self, db: sqlite3.Connection, file: str) -> None:
        serial = next(self._serial)
        state: dict[str, Any] = {"tx": None, "busy": False}

        def settings() -> tuple[int, str]:
            state["busy"] = True
            try:
                return (int(db.execute("PRAGMA synchronous").fetchone()[0]),
                        str(db.execute("PRAGMA journal_mode").fetchone()[0]))
            finally:
                state["busy"] = False

        def on_statement(sql: str) -> None:
            if state["busy"]:
                return  # our own pragma reads
            text = sql.strip().rstrip(";").strip()
            if not text or text.startswith("--"):
                return
            n = next(self._count)
            self.statements.append((file, text))
            head = text.split(None, 1)[0].upper()
            if head == "BEGIN":
                state["tx"] = (n, [])
            elif head in ("COMMIT", "END") and state["tx"] is not None:
                begin, writes = state["tx"]
                state["tx"] = None
                self.commits.append(Commit(file, serial, begin, n, *settings(), writes))
            elif head == "ROLLBACK":
                state["tx"] = None
            elif head in _WRITES:
                if state["tx"] is not None:
                    state["tx"][1].append(text)
                elif not db.in_transaction:  # autocommit: this statement is its own transaction
                    self.commits.append(Commit(file, serial, n, n, *settings(), [text]))

        db.set_trace_callback(on_statement)


def durability_problems(commits: Sequence[Commit], *, ledger_sync: str = "normal",
                        dataplane: str = "dataplane.sqlite", ledger: str = "ledger.sqlite") -> list[str]:
    """Breaches of the capture durability contract in ``commits`` (observation order), in words:

    * every data-plane commit that stages rows runs in WAL mode at ``synchronous`` FULL or
      above (its rows are fsynced before ``stage_many`` returns);
    * every ledger commit that writes a committed outcome runs in WAL mode at NORMAL
      (``ledger_sync="normal"``) or FULL and above (``"full"``), and BEGINs only after the
      data-plane commits of every row its staging chain names have finished, at FULL:
      no ledger row points at a staged row that is not durable.
    """
    problems: list[str] = []
    durable: dict[str, int] = {}   # staged key -> statement number of the FULL commit that made it durable
    for c in sorted(commits, key=lambda c: c.end):
        if c.file == dataplane and c.staged_keys():
            if c.journal_mode != "wal" or c.synchronous < FULL:
                problems.append(f"{c.describe()}: staged rows {c.staged_keys()[:3]} are not fsynced at commit")
                continue
            for key in c.staged_keys():
                durable.setdefault(key, c.end)
        if c.file == ledger:
            committed = [body for status, body in c.outcomes() if status == "committed"]
            if not committed:
                continue
            wanted = NORMAL if ledger_sync == "normal" else FULL
            ok_level = c.synchronous == wanted if wanted == NORMAL else c.synchronous >= FULL
            if c.journal_mode != "wal" or not ok_level:
                problems.append(f"{c.describe()}: ledger outcomes expected at "
                                f"synchronous={LEVEL_NAMES[wanted]} in WAL mode (ledger_sync={ledger_sync})")
            for body in committed:
                for key in body["staging_chain"]:
                    at = durable.get(key)
                    if at is None or at > c.begin:
                        problems.append(f"{c.describe()}: committed outcome "
                                        f"{body['rollout_id']}/{body['model_call_id']} points at staged row "
                                        f"{key} that was not durable when this transaction began")
    return problems


EOS = 2


def _render(turns: list[list[int]], gen: bool) -> list[int]:
    """A chat-template stand-in: each turn framed by start / role / newline ... eos / newline."""
    out: list[int] = []
    for i, content in enumerate(turns):
        out += [1, 5 if i % 2 == 0 else 6, 3, *content, EOS, 3]
    return out + ([1, 6, 3] if gen else [])


def run_turns(path: Path, *, rollouts: int = 4, turns: int = 3, ledger_sync: str = "normal",
              around_finish: Callable[[int, Callable[[], Any]], Any] | None = None) -> list[str]:
    """Real capture batches on ``path/{ledger,dataplane}.sqlite``: per turn one
    ``admit_many`` (driver), one ``begin_requests`` and one ``finish_requests``
    (engine owner) over every rollout; turn t > 0 continues turn t-1. Outputs
    are a pure function of (rollout, turn). ``around_finish(turn, finish)`` may
    wrap each finish batch (``finish()`` runs it). Returns the rollout ids."""
    from harness.capture.admission import AdmissionRequest, CaptureAdmitter
    from harness.capture.ledger import CaptureLedger
    from harness.capture.sink import CaptureSink
    from harness.dataplane.staging_db import StagingDB

    ledger = CaptureLedger(path / "ledger.sqlite")
    dp = StagingDB(path / "dataplane.sqlite")
    sink = CaptureSink(StagingDB(path / "dataplane.sqlite"), CaptureLedger(path / "ledger.sqlite"),
                       ledger_sync=ledger_sync)
    admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    rids = [f"r{i}" for i in range(rollouts)]
    history = {r: [[20 + i]] for i, r in enumerate(rids)}
    for t in range(turns):
        reqs = [AdmissionRequest.root(r, "c0", _render(history[r], True)) if t == 0 else
                AdmissionRequest.continuation(r, f"c{t}", f"c{t - 1}", _render(history[r][:-1], False),
                                              _render(history[r], True)) for r in rids]
        results = admitter.admit_many(reqs)
        ok = [(r, res) for r, res in zip(rids, results) if res.ok]
        handles = sink.begin_requests([(res.request_capture(), res.prompt_ids) for _, res in ok], weight_version=t)
        finished = []
        for (r, _), h in zip(ok, handles):
            out = [30 + int(r[1:]) + t, 40 + t, EOS]
            finished.append((h, out, [-0.5, -0.25, -0.125], t))
            history[r] += [out[:-1], [50 + t]]

        def finish(batch=finished):
            return sink.finish_requests(batch)

        coords = around_finish(t, finish) if around_finish else finish()
        assert all(c["disposition"] == "staged" for c in coords), coords
    sink.close(); ledger.close(); dp.close()
    return rids
