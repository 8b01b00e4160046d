"""One real ``golden check`` of the smoke workload, in a subprocess, seen from a CI log.

* ``RAY_ADDRESS`` pointing where nothing listens: on a Ray cluster node (KubeRay
  pods, CI runners on a cluster) the variable is usually set. Followed, it would
  put a golden run's actors on a shared cluster, and ``ray.init`` refuses
  ``num_cpus`` when connecting ("When connecting to an existing cluster, num_cpus
  and num_gpus must not be provided"), so every run failed before it started.
* ``--format junit --output FILE``: the report goes to the file and the log gets
  one summary line, as with ``golden diff`` (it used to print the XML too).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from suites.stored_goldens import stored_dir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("check")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO), "RAY_ADDRESS": "127.0.0.1:9"}
    env.pop("GOLDEN_PLATFORM", None)
    report = tmp / "report.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "check", "qwen3_moe_tiny_smoke", "--run-dir", str(tmp / "run"),
         "--format", "junit", "--output", str(report)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    return proc, report


def test_check_ignores_ray_address_and_says_so(checked):
    proc, _ = checked
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "RAY_ADDRESS=127.0.0.1:9 is ignored" in out
    assert "Connecting to existing Ray cluster" not in out


def test_check_with_output_writes_the_report_there_and_one_line_to_stdout(checked):
    proc, report = checked
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    suites = ET.parse(report).getroot()
    cases = suites.findall(".//testcase")
    assert len(cases) >= 6 and not suites.findall(".//failure")
    assert "<testsuite" not in proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    label = f"qwen3_moe_tiny_smoke [{stored_dir('qwen3_moe_tiny_smoke').name}]: "  # cpu or its CPU-numerics variant
    assert lines == [lines[0]] and lines[0].startswith(label) and str(report) in lines[0]
