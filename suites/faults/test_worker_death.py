"""A policy worker dying mid-step ends the run, names the worker, leaves no orphans.

The workload runs in a subprocess (``golden run``) so that every process it
starts (Ray's raylet and GCS, actors, internal engine processes) is a
descendant we can account for afterwards.

The run must notice the death itself (Ray reports the dead actor), not through
a surviving rank's collective timing out: the collective timeout is set to an
hour, far beyond the test's hang guard, so a run that waited for it would be
killed by the guard and fail. The detection latency is printed, not asserted
(timing never decides a test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _session_members(sid: int) -> set[int]:
    """Processes whose session id is ``sid`` (everything the run started, however deep)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().split(")")[-1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 of /proc/pid/stat: session
            out.add(int(entry.name))
    return out


def test_dead_policy_worker_fails_the_run_with_its_rank(tmp_path):
    run_dir = tmp_path / "run"
    stamp = tmp_path / "died_at"
    env = dict(os.environ, RAY_AUTH_MODE="disabled", GOLDEN_FAULT_STAMP=str(stamp),
               GOLDEN_WORKER_SETUP_HOOK="harness.mutations.policy_rank1_dies_in_step2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", "qwen3_moe_tiny_streaming",
         "plugins.policy_profiler=null", "plugins.rollout_profiler=null", "grpo.trainer=sync",
         "--option", "collective_timeout_s=3600", "--run-dir", str(run_dir)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=300)  # hang guard, far below the collective timeout
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        pytest.fail("the run hung after the worker died (it did not notice the death itself)")
    ended = time.time()
    assert proc.returncode == 3, out  # EXIT_NO_VERDICT: the run did not complete
    assert stamp.exists(), "the planted fault never fired:\n" + out
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "failed"
    assert "policy worker 1 (rank 1, coords" in run["error"] and "died during train" in run["error"], run["error"]
    # its own exit, not Ray's wrapper text; the peers come after it as consequences
    assert "worker process exited (" in run["error"] and "There are some potential root causes" not in run["error"]
    assert "\x1b[" not in run["error"], run["error"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (completed,) = [c for c in manifest["checks"] if c["name"] == "run_completed"]
    assert completed["outcome"] == "fail" and "policy worker 1" in completed["detail"]
    assert "\x1b[" not in completed["detail"] and str(tmp_path) not in completed["detail"], completed["detail"]
    print(f"death noticed and run ended {ended - float(stamp.read_text()):.1f} s after the worker died")
    deadline = time.monotonic() + 30
    while (left := _alive(_session_members(proc.pid))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"orphan processes after a failed run: {sorted(left)}"
