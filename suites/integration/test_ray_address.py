"""A golden run starts its own local Ray even where ``RAY_ADDRESS`` names a cluster.

On a Ray cluster node (KubeRay pods, CI runners on a cluster) ``RAY_ADDRESS`` is
usually set. Followed, it would put a golden run's actors on a shared cluster,
and ``ray.init`` refuses ``num_cpus`` when connecting ("When connecting to an
existing cluster, num_cpus and num_gpus must not be provided"), so the run
failed before it started. A real ``golden check`` of the smoke workload, in a
subprocess, with ``RAY_ADDRESS`` pointing at an address where nothing listens.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_check_ignores_ray_address_and_says_so(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO), "RAY_ADDRESS": "127.0.0.1:9"}
    env.pop("GOLDEN_PLATFORM", None)
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "check", "qwen3_moe_tiny_smoke", "--run-dir", str(tmp_path / "run")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "RAY_ADDRESS=127.0.0.1:9 is ignored" in out
    assert "Connecting to existing Ray cluster" not in out
