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
