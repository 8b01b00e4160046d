"""SIGTERM / Ctrl-C end a ``pytest -m golden`` session within 5 s (issue 41).

Before: SIGTERM 35 s into ``pytest -m golden`` interrupted the running workload (its six
tests failed "run_completed: interrupted"), then pytest went on with every remaining
workload and exited 84.6 s later. Now the running workload is stopped and marked
interrupted, no other workload starts, and pytest exits 143 (130 for Ctrl-C).

pytest runs in a subprocess; the signal is sent once the first workload's progress shows
its workers starting (an event, not a delay).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FIRST, SECOND = "qwen3_moe_tiny_multiturn", "qwen3_moe_tiny_smoke"  # collected in this order


def _unblock_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background CI shell may ignore it; Ctrl-C would not be


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_signal_ends_the_golden_session_within_5_s(tmp_path, sig):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO), "GOLDEN_PROGRESS": "plain",
           "GOLDEN_PLATFORM": "cpu"}
    cmd = [sys.executable, "-m", "pytest", "suites/golden/test_goldens.py", "-m", "golden", "-p", "no:cacheprovider",
           "-k", f"{FIRST}- or {SECOND}-", "--basetemp", str(tmp_path / "bt"), "-q"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_unblock_sigint)  # noqa: PLW1509 - no threads here
    seen, sent = [], None
    try:
        for line in proc.stdout:
            seen.append(line)
            if sent is None and "policy workers" in line:  # the first workload's "spawning N policy workers"
                proc.send_signal(sig)
                sent = time.monotonic()
                break
        rest = proc.communicate(timeout=120)[0]
        ended = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen) + rest
    assert sent is not None, out
    assert f"golden {SECOND}" not in out, out  # the second workload never started (main: it ran)
    assert proc.returncode == 128 + sig, out  # main: 1 (tests failed), the session went on
    assert ended - sent < 5, (ended - sent, out)  # main: 5.5 s here with a warm 2-workload session, 85 s in the issue
