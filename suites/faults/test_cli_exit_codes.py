"""Exit codes of real runs that do not complete: interrupted capture (130 Ctrl-C, 143 SIGTERM), crashed run (3).

``golden capture`` runs in a subprocess; the signal is sent once its progress
output shows the workers starting (an event, not a delay). What must hold:
the distinct exit code, no golden written, no temporary sibling left behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SMOKE = "qwen3_moe_tiny_smoke"


def _env() -> dict:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    env.pop("GOLDEN_PLATFORM", None)
    return env


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "goldens"
    (r / SMOKE).mkdir(parents=True)
    shutil.copy(REPO / "goldens" / SMOKE / "workload.yaml", r / SMOKE / "workload.yaml")
    return r


def _unblock_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background CI shell may ignore it; Ctrl-C would not be


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM],
                         ids=["ctrl-c", "sigterm"])
def test_interrupted_capture_exits_128_plus_the_signal_and_stores_nothing(root, tmp_path, sig):
    cmd = [sys.executable, "-m", "harness.cli", "capture", SMOKE, "--goldens-root", str(root),
           "--run-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_unblock_sigint)  # noqa: PLW1509 - no threads here
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "policy workers" in line:  # the "spawning N policy workers" phase
                proc.send_signal(sig)
                break
        rest = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen) + rest
    assert any("policy workers" in line for line in seen), out
    assert proc.returncode == 128 + sig, out  # 130 Ctrl-C, 143 SIGTERM (issue 41; before: 130 for both)
    assert "interrupted" in out and "Traceback" not in out
    assert sorted(p.name for p in (root / SMOKE).iterdir()) == ["workload.yaml"]  # no golden, no .cpu.tmp-*


def test_a_run_that_crashes_exits_3_not_1(root, tmp_path):
    """Exit 1 means "the surfaces differ"; a run that never finished has no verdict.

    The workers die at start-up: their setup hook does not import (a plugin class path
    that does not import is now refused before Ray starts, exit 2)."""
    cmd = [sys.executable, "-m", "harness.cli", "check", SMOKE,
           "--goldens-root", str(REPO / "goldens"), "--run-dir", str(tmp_path / "run"), "-q"]
    env = {**_env(), "GOLDEN_WORKER_SETUP_HOOK": "harness.mutations.no_such_hook"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 3, proc.stderr
    assert "FAIL run_completed" in proc.stderr and "no verdict" in proc.stderr
