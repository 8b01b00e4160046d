"""SIGKILL a run after iteration k, resume it, get the uninterrupted run's surfaces.

The killed run checkpoints every step (policy, optimizer, RNG, loader
position, data plane, ledger, engine weight version). The whole process group
(driver, Ray, actors, engine processes) is killed with SIGKILL right after the
checkpoint of step 2 lands, in the middle of step 3; ``golden run --resume``
then finishes the run, and postflight merges the trace segments.
"""

from __future__ import annotations

import json

import pytest

from harness import flows
from harness.surfaces.canonical import canonical_bytes
from suites.kill_run import run_until_checkpoint_then_kill

pytestmark = pytest.mark.slow

WORKLOAD = "qwen3_moe_tiny_smoke"
OVERRIDES = ["grpo.iterations=4", "grpo.checkpoint_every=1"]
GATED = ("topology", "lifecycle", "operators", "collectives", "rollouts", "training", "numerics")


def test_killed_and_resumed_run_matches_uninterrupted(tmp_path):
    reference = flows.execute(WORKLOAD, overrides=tuple(OVERRIDES), run_dir=tmp_path / "reference")
    assert reference.ok, reference.problems()

    run_dir = tmp_path / "killed"
    run_until_checkpoint_then_kill([WORKLOAD, *OVERRIDES], run_dir)  # killed mid-run, or the resume proves nothing

    resumed = flows.resume(run_dir)
    assert resumed.ok, resumed.problems()
    (resume_point,) = json.loads((run_dir / "run.json").read_text())["resumed"]
    assert 2 <= resume_point["after_step"] < 4, resume_point  # from a checkpoint, not rerun from scratch
    for name in GATED:
        assert canonical_bytes(resumed.postflight.surfaces[name]) == canonical_bytes(
            reference.postflight.surfaces[name]), name
