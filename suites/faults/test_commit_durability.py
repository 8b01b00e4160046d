"""Durability checked where it happens: at each staging and ledger commit (issue 23 item 1).

Real capture batches (admitter, sink, both SQLite stores) run under a
``CommitObserver``: a trace callback on every connection sees each
transaction and reads ``PRAGMA synchronous`` / ``journal_mode`` as its COMMIT
starts. The documented order per finish batch (docs/capture.md,
"Durability"): the staged rows commit first in WAL mode at FULL (fsynced),
then the ledger outcomes at NORMAL, or FULL with ``ledger_sync: full``.

A pragma read at open (the older tests) cannot see a commit that turns
synchronous off only for itself; the planted regressions below show that
these checks do. The strace test counts the fsyncs themselves, per file and
per batch, in a child process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.dataplane.staging_db import StagingDB
from suites.faults import planted
from suites.faults.commit_observer import FULL, NORMAL, CommitObserver, durability_problems, run_turns

REPO = Path(__file__).resolve().parents[2]
ROLLOUTS, TURNS = 4, 3


def _observed_batches(tmp_path, monkeypatch, ledger_sync="normal"):
    observer = CommitObserver().install(monkeypatch.setattr)
    batches = []

    def around_finish(turn, finish):
        start = observer.mark()
        coords = finish()
        batches.append(observer.commits[start:])
        return coords

    run_turns(tmp_path, rollouts=ROLLOUTS, turns=TURNS, ledger_sync=ledger_sync, around_finish=around_finish)
    return observer, batches


@pytest.mark.parametrize("ledger_sync,ledger_level", [("normal", NORMAL), ("full", FULL)])
def test_each_finish_batch_commits_the_rows_fsynced_then_the_ledger(tmp_path, monkeypatch, ledger_sync,
                                                                    ledger_level):
    observer, batches = _observed_batches(tmp_path, monkeypatch, ledger_sync)
    assert len(batches) == TURNS
    for turn, commits in enumerate(batches):
        keys = [f"r{i}/c{turn}" for i in range(ROLLOUTS)]
        stage, outcomes = commits  # exactly two commits per finish batch, in this order
        assert (stage.file, stage.journal_mode, stage.synchronous) == ("dataplane.sqlite", "wal", FULL)
        assert stage.staged_keys() == keys
        assert (outcomes.file, outcomes.journal_mode, outcomes.synchronous) == ("ledger.sqlite", "wal", ledger_level)
        assert [(s, f"{b['rollout_id']}/{b['model_call_id']}") for s, b in outcomes.outcomes()] == \
            [("committed", k) for k in keys]
        assert stage.end < outcomes.begin  # the ledger transaction starts after the stage COMMIT
        fsynced = sum(1 for c in commits if c.synchronous >= FULL)
        assert fsynced == (1 if ledger_sync == "normal" else 2)
    assert durability_problems(observer.commits, ledger_sync=ledger_sync) == []
    # the admissions (driver, one transaction per turn) commit at NORMAL, as documented
    admissions = [c for c in observer.commits if any(w.startswith("INSERT INTO admissions") for w in c.writes)]
    assert [(c.file, c.synchronous) for c in admissions] == [("ledger.sqlite", NORMAL)] * TURNS


def test_sync_off_around_the_stage_commit_is_caught_where_a_pragma_read_at_open_is_not(tmp_path, monkeypatch):
    planted.sync_off_around_stage_commit(monkeypatch.setattr)
    observer, batches = _observed_batches(tmp_path, monkeypatch)
    store = StagingDB(tmp_path / "dataplane.sqlite")
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == FULL  # what the older tests read: fine
    store.stage_many([("x/c0", {"a": 1})])
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == FULL  # still fine after a stage
    store.close()
    assert [c[0].synchronous for c in batches] == [0] * TURNS
    problems = durability_problems(observer.commits)
    stages = [p for p in problems if p.startswith("dataplane.sqlite")]
    assert len(stages) == TURNS + 1  # every stage commit, the extra one above included
    assert all(re.match(r"dataplane\.sqlite commit \(statements \d+\.\.\d+\) at synchronous=OFF, "
                        r"journal_mode=wal: staged rows \['(r0|x)/c\d'.* are not fsynced at commit$", p)
               for p in stages), stages
    # and every committed outcome then points at rows that were never durable: turn t's chain has t+1 rows
    pointing = [p for p in problems if p.startswith("ledger.sqlite")]
    assert len(pointing) == ROLLOUTS * sum(t + 1 for t in range(TURNS)), pointing


def test_ledger_rows_before_their_stage_are_caught(tmp_path, monkeypatch):
    planted.ledger_before_stage(monkeypatch.setattr)
    observer, batches = _observed_batches(tmp_path, monkeypatch)
    assert [[c.file for c in b] for b in batches] == [["ledger.sqlite", "dataplane.sqlite"]] * TURNS
    problems = durability_problems(observer.commits)
    assert len(problems) == ROLLOUTS * TURNS, problems
    assert ("committed outcome r0/c0 points at staged row r0/c0 that was not durable when this transaction "
            "began") in problems[0]


# -- the fsyncs themselves ----------------------------------------------------------------------------

STRACE_CHILD = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from suites.faults import planted
    from suites.faults.commit_observer import run_turns
    path, ledger_sync, plant = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    if plant != "none":
        getattr(planted, plant)()

    def around_finish(turn, finish):
        os.access(f"/batch-{turn}-begins", os.F_OK)  # markers in the syscall trace
        try:
            return finish()
        finally:
            os.access(f"/batch-{turn}-ends", os.F_OK)

    run_turns(path, turns=4, ledger_sync=ledger_sync, around_finish=around_finish)
""")
_SYSCALL = re.compile(r"^\d+\s+(fsync|fdatasync|access|faccessat2?)\((?:AT_FDCWD, )?(?:\d+<([^>]*)>|\"([^\"]*)\")")


def _strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(["strace", "-f", "-qq", "-e", "trace=fsync", sys.executable, "-c", "pass"],
                           capture_output=True, text=True, check=False)
    return probe.returncode == 0


def _fsyncs_per_batch(tmp_path: Path, ledger_sync: str, plant: str) -> list[dict[str, int]]:
    """Fsync/fdatasync calls per file name within each finish batch of a child run (turns 1..3;
    turn 0 creates the WAL files, whose first commits may sync more)."""
    log = tmp_path / "strace.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    syscalls = "trace=fsync,fdatasync,access,faccessat,faccessat2"
    subprocess.run(["strace", "-f", "-qq", "-y", "-o", str(log), "-e", syscalls,
                    sys.executable, "-c", STRACE_CHILD, str(tmp_path), ledger_sync, plant],
                   check=True, env=env, cwd=REPO, timeout=120)
    batches: list[dict[str, int]] = []
    current: dict[str, int] | None = None
    for line in log.read_text().splitlines():
        m = _SYSCALL.match(line)
        if not m:
            continue
        call, fd_path, marker = m.groups()
        if marker and marker.startswith("/batch-"):
            current = {} if marker.endswith("-begins") else None
            if current is not None:
                batches.append(current)
        elif current is not None and call in ("fsync", "fdatasync"):
            name = Path(fd_path).name
            current[name] = current.get(name, 0) + 1
    return batches[1:]


@pytest.mark.skipif(not _strace_works(), reason="strace missing or ptrace not permitted here; "
                                                "the trace-callback tests above still check every commit")
@pytest.mark.parametrize("ledger_sync,plant,expected", [
    ("normal", "none", {"dataplane.sqlite-wal": 1}),
    ("full", "none", {"dataplane.sqlite-wal": 1, "ledger.sqlite-wal": 1}),
    ("normal", "sync_off_around_stage_commit", {}),
])
def test_fsyncs_per_finish_batch_seen_by_strace(tmp_path, ledger_sync, plant, expected):
    batches = _fsyncs_per_batch(tmp_path, ledger_sync, plant)
    assert batches == [expected] * 3
