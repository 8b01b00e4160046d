"""Crash consistency of capture: SIGKILL the writer between (and inside) its
commits, reopen, and no ledger row may point at a staged row that is not
there (issue 23 item 1).

The writer is a forked child process running real capture batches
(``commit_observer.run_turns``: admission, begin, stage, ledger transactions
on real SQLite files). Kill points are statement numbers, not times: the
child counts every SQL statement its connections start (a trace callback)
and, at statement *k*, tells the parent and waits; the parent SIGKILLs it
there. A dry run lists the statements; the points are every statement that
follows a COMMIT (the child dies between two commits) plus a seeded sample of
the others (it dies inside a transaction). On reopen, from this process:
every committed ledger outcome's staging chain must fetch and verify, and
finalisation may mask a rollout only for an unfinished or failed call, never
for a staged row that does not verify.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import select
import signal
import sqlite3
import sys
import traceback
from pathlib import Path

import pytest

from harness.capture.finalize import finalize_from_ledger, mask_cause
from harness.capture.ledger import CaptureLedger
from harness.capture.records import CallRecord
from harness.dataplane.staging_db import DataPlaneError, StagingDB
from suites.faults import planted
from suites.faults.commit_observer import run_turns

ROLLOUTS, TURNS, SEED, INSIDE_POINTS = 3, 3, 23, 16
HANG_GUARD_S = 120  # a writer that neither reports nor exits is a hang, not a verdict on timing


def _writer(path: Path, kill_at: int | None, report: int, plant: str | None) -> None:
    """The child: run the batches; at statement ``kill_at`` report it and wait for SIGKILL."""
    if plant:
        getattr(planted, plant)()
    counter = itertools.count()
    seen: list[tuple[str, str]] = []
    real = sqlite3.connect

    def connect(database, *args, **kwargs):
        db = real(database, *args, **kwargs)
        name = Path(str(database)).name

        def on_statement(sql: str) -> None:
            text = sql.strip().rstrip(";").strip()
            if not text or text.startswith("--"):
                return
            n = next(counter)
            seen.append((name, text.split(None, 1)[0].upper()))
            if n == kill_at:
                os.write(report, (json.dumps({"killed_at": n, "statement": [name, text[:80]]}) + "\n").encode())
                signal.pause()  # SIGKILL arrives here, before statement n runs

        db.set_trace_callback(on_statement)
        return db

    sqlite3.connect = connect  # this process only: it is a forked child
    run_turns(path, rollouts=ROLLOUTS, turns=TURNS)
    os.write(report, (json.dumps({"done": seen}) + "\n").encode())


def _run_writer(path: Path, kill_at: int | None = None, plant: str | None = None) -> dict:
    path.mkdir(parents=True)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        try:
            os.close(read)
            _writer(path, kill_at, write, plant)
        except BaseException:  # noqa: BLE001 - reported through the exit code and stderr
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    data = b""
    try:
        while not data.endswith(b"\n"):
            ready, _, _ = select.select([read], [], [], HANG_GUARD_S)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"writer hung (kill point {kill_at})")
            chunk = os.read(read, 1 << 20)
            if not chunk:
                break
            data += chunk
        msg = json.loads(data) if data else {}
        if "killed_at" in msg:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(read)
        _, status = os.waitpid(pid, 0)
    if "killed_at" in msg:
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert msg["killed_at"] == kill_at
    else:
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and "done" in msg, f"writer failed ({status})"
    return msg


def _kill_points(statements: list[list[str]], inside: int) -> list[int]:
    after_commit = [i for i in range(1, len(statements)) if statements[i - 1][1] in ("COMMIT", "END")]
    others = [i for i in range(len(statements)) if i not in after_commit]
    return sorted(after_commit + random.Random(SEED).sample(others, inside))


def _reopen_and_check(path: Path) -> tuple[list[str], dict[str, int]]:
    """(breaches of the invariant, what the killed writer left) from a fresh connection."""
    ledger = CaptureLedger(path / "ledger.sqlite")
    dp = StagingDB(path / "dataplane.sqlite")
    try:
        problems = []
        bodies = ledger._db.execute("SELECT body FROM calls WHERE status = 'committed'").fetchall()
        committed = [CallRecord.from_dict(json.loads(b)) for (b,) in bodies]
        for rec in committed:
            for key in rec.staging_chain:
                try:
                    dp.fetch(key)
                except (KeyError, DataPlaneError) as exc:
                    problems.append(f"ledger row {rec.staging_key} points at staged row {key}: {exc}")
        rids = ledger.rollout_ids()
        _, samples, _ = finalize_from_ledger([(r, 0.0, None) for r in rids], ledger, dp)
        problems += [f"{s.rollout_id} masked by {s.reason}" for s in samples
                     if s.masked and mask_cause(s.reason).startswith("verification failed")]
        outcomes = {f"{r}/{c}" for r, c in ledger._db.execute("SELECT rollout_id, model_call_id FROM calls")}
        left = {"committed": len(committed), "staged": len(dp.keys()),
                "staged_without_outcome": len(set(dp.keys()) - outcomes),
                "admitted_without_outcome": ledger._db.execute(
                    "SELECT COUNT(*) FROM admissions a LEFT JOIN calls c USING (rollout_id, model_call_id) "
                    "WHERE c.status IS NULL").fetchone()[0],
                "trained": sum(1 for s in samples if not s.masked)}
        return problems, left
    finally:
        ledger.close()
        dp.close()


def _sweep(tmp_path: Path, plant: str | None = None, inside: int = INSIDE_POINTS
           ) -> list[tuple[int, list[str], dict[str, int]]]:
    statements = _run_writer(tmp_path / "dry", plant=plant)["done"]
    assert len(statements) > 40, statements  # the batches really ran
    out = []
    for k in _kill_points(statements, inside):
        _run_writer(tmp_path / f"k{k}", kill_at=k, plant=plant)
        out.append((k, *_reopen_and_check(tmp_path / f"k{k}")))
    return out


def test_no_ledger_row_points_at_a_row_that_is_not_durable_whenever_the_writer_dies(tmp_path):
    results = _sweep(tmp_path)
    assert [(k, problems) for k, problems, _ in results if problems] == []
    left = [state for _, _, state in results]
    assert len(results) >= 20
    # the points reach every window that matters: killed after a stage commit and before its
    # ledger commit (rows staged, no outcome yet), after an admission and before the outcome,
    # and after a whole batch (rollouts that train)
    assert any(s["staged_without_outcome"] > 0 for s in left)
    assert any(s["admitted_without_outcome"] > 0 and s["staged_without_outcome"] == 0 for s in left)
    assert any(s["trained"] == ROLLOUTS for s in left) and any(s["committed"] == 0 for s in left)


@pytest.mark.parametrize("plant,expected", [
    ("ledger_before_stage", "points at staged row r0/c"),
    ("stage_returns_before_commit", "points at staged row r0/c0: \"data plane has no row under key 'r0/c0'\""),
])
def test_the_crash_check_catches_a_writer_that_breaks_the_order(tmp_path, plant, expected):
    results = _sweep(tmp_path, plant, inside=0)  # the points between commits are where these show
    found = [p for _, problems, _ in results for p in problems]
    assert any(expected in p for p in found), found
    assert any(p.endswith("masked by fetch_failed:KeyError") for p in found), found


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="fork + SIGKILL of a writer process: Linux only")
