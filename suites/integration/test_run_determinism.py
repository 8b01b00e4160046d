"""Whole-run determinism: a rerun gives bit-identical gated surfaces.

Also: the engine's batch size is a scheduling detail, so changing it changes
no request's tokens (the rollouts surface carries every sample's digest) and
nothing the policy trains on.
"""

from __future__ import annotations

import pytest

from harness import flows
from harness.surfaces.canonical import canonical_bytes

pytestmark = pytest.mark.slow

WORKLOAD = "qwen3_moe_tiny_smoke"
GATED = ("topology", "lifecycle", "operators", "collectives", "rollouts", "training")


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    execution = flows.execute(WORKLOAD, run_dir=tmp_path_factory.mktemp("first") / "run")
    assert execution.ok, execution.problems()
    return execution


def test_rerun_is_bit_identical(first, tmp_path):
    again = flows.execute(WORKLOAD, run_dir=tmp_path / "run")
    assert again.ok, again.problems()
    for name in GATED:
        assert canonical_bytes(again.postflight.surfaces[name]) == canonical_bytes(first.postflight.surfaces[name]), (
            name
        )


def test_engine_batch_size_changes_no_tokens(first, tmp_path):
    other = flows.execute(WORKLOAD, overrides=("rollout.max_batch_size=3",), run_dir=tmp_path / "run")
    assert other.ok, other.problems()
    for name in ("rollouts", "training"):
        assert other.postflight.surfaces[name] == first.postflight.surfaces[name], name


def test_timings_carry_every_steps_phases_and_the_refit_breakdown(first):
    """The informational timings surface: per GRPO step the driver's phases, and the zmq refit
    split into collect (the policy's full weights on rank 0), send and wait; the parts are
    measured inside the refit, so they never add up to more than it."""
    phases = first.postflight.surfaces["timings"]["sections"]["driver"]["phases"]
    for step in (1, 2, 3):
        got = {k.split("/", 1)[1]: v["wall_s"] for k, v in phases.items() if k.startswith(f"step{step:04d}/")}
        assert {"generation", "policy_training", "refit", "refit/collect", "refit/send", "refit/wait",
                "total_step_time"} <= set(got), sorted(got)
        parts = [got["refit/collect"], got["refit/send"], got["refit/wait"]]
        assert min(parts) >= 0.0 and sum(parts) <= got["refit"] + 1e-6
