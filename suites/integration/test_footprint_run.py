"""A real cold run (driver, Ray rank actors forked from the zygote, rollout engine, data-plane actor)
records its footprint, and a change to a module that only a Ray worker imported selects the workload."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.footprint.affected import affected
from harness.footprint.schema import problems

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = "qwen3_moe_tiny_smoke"
WORKER_ONLY = "harness/policy/native/engine.py"  # imported by create_engine in the policy rank, never the driver

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("fp") / "run"
    out = subprocess.run([sys.executable, "-m", "harness.cli", "run", WORKLOAD, f"--run-dir={run}", "-q"],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return run


def _records(run: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((run / "footprint").glob("*.paths"))}


def test_every_process_records_and_the_worker_only_module_is_in_the_footprint(run_dir):
    records = _records(run_dir)
    driver = [text for text in records.values() if "/harness/cli/run.py\n" in text]
    assert len(driver) == 1, "exactly one driver record"
    assert f"/{WORKER_ONLY}\n" not in driver[0] and "/harness/policy/native/__pycache__/engine." not in driver[0]
    assert len(records) >= 3  # driver, policy rank, rollout actor (and the data-plane actor)
    doc = json.loads((run_dir / "footprint.json").read_text())
    assert problems(doc, "footprint.json") == []
    assert WORKER_ONLY in doc["files"]
    assert "harness/rollout/native/engine.py" in doc["files"]
    assert not [f for f in doc["files"] if f.startswith(("harness/rollout/vllm/", "harness/policy/megatron/"))]
    assert doc["distributions"]["torch"].startswith("2.13.0") and doc["python"]


def _repo_with(tmp_path: Path, footprint: Path) -> Path:
    repo = tmp_path / "repo"
    golden = repo / "goldens" / WORKLOAD / "cpu"
    golden.mkdir(parents=True)
    (golden.parent / "workload.yaml").write_text((REPO / "goldens" / WORKLOAD / "workload.yaml").read_text())
    (golden / "FOOTPRINT.json").write_bytes(footprint.read_bytes())
    for rel in (WORKER_ONLY, "harness/rollout/vllm/engine.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("# v1\n")
    git = ["git", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (golden / "PROVENANCE.json").write_text(json.dumps({"commit": head}))  # dated as a refresh dates it
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "golden"], check=True)
    return repo


def test_a_change_to_a_module_imported_only_in_a_ray_worker_selects_the_workload(run_dir, tmp_path):
    repo = _repo_with(tmp_path, run_dir / "footprint.json")
    (repo / "harness/rollout/vllm/engine.py").write_text("# v2\n")
    assert [s.selected for s in affected("HEAD", repo / "goldens", "cpu")] == [False]  # the vLLM backend: not read
    (repo / WORKER_ONLY).write_text("# v2\n")
    (chosen,) = affected("HEAD", repo / "goldens", "cpu")
    assert chosen.selected and chosen.reason == f"{WORKER_ONLY}: read by its run (cpu/FOOTPRINT.json)"
