"""SIGKILL a run after iteration k, resume it, get the uninterrupted run's surfaces.

The killed run checkpoints every step (policy, optimizer, RNG, loader
position, data plane, ledger, engine weight version). The whole process group
(driver, Ray, actors, engine processes) is killed with SIGKILL right after the
checkpoint of step 2 lands, in the middle of step 3; ``golden run --resume``
then finishes the run, and postflight merges the trace segments.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from harness import flows
from harness.surfaces.canonical import canonical_bytes

pytestmark = pytest.mark.slow

WORKLOAD = "qwen3_moe_tiny_smoke"
OVERRIDES = ["grpo.iterations=4", "grpo.checkpoint_every=1"]
GATED = ("topology", "lifecycle", "operators", "collectives", "rollouts", "training")


def test_killed_and_resumed_run_matches_uninterrupted(tmp_path):
    reference = flows.execute(WORKLOAD, overrides=tuple(OVERRIDES), run_dir=tmp_path / "reference")
    assert reference.ok, reference.problems()

    run_dir = tmp_path / "killed"
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", WORKLOAD, *OVERRIDES, "--run-dir", str(run_dir)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    marker = run_dir / "checkpoints" / "step0002" / "state.json"
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint of step 2 appeared"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    # killed mid-run, not finished before the signal landed (or the resume below proves nothing)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"

    resumed = flows.resume(run_dir)
    assert resumed.ok, resumed.problems()
    (resume_point,) = json.loads((run_dir / "run.json").read_text())["resumed"]
    assert 2 <= resume_point["after_step"] < 4, resume_point  # from a checkpoint, not rerun from scratch
    for name in GATED:
        assert canonical_bytes(resumed.postflight.surfaces[name]) == canonical_bytes(
            reference.postflight.surfaces[name]), name
