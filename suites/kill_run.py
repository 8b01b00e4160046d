"""Kill a `golden run` subprocess once its step-N checkpoint exists (the resume tests).

``run_until_checkpoint_then_kill`` starts ``python -m harness run ARGS`` in its own
session, waits for ``checkpoints/stepNNNN/state.json`` under the run directory, kills the
whole process group with SIGKILL and asserts the run was killed mid-run (its run.json
still says ``running``): a run that finished before the signal would prove nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def run_until_checkpoint_then_kill(args: list[str], run_dir: Path, *, step: int = 2,
                                   timeout_s: float = 240.0) -> None:
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", *args, "--run-dir", str(run_dir)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    marker = Path(run_dir) / "checkpoints" / f"step{step:04d}" / "state.json"
    deadline = time.monotonic() + timeout_s
    while not marker.exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, f"no checkpoint of step {step} appeared"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert json.loads((Path(run_dir) / "run.json").read_text())["status"] == "running"
