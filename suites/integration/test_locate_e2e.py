"""``golden locate`` end to end: a golden captured at a commit of a scratch repository, a run of
a planted change (the router's top-k tie-break, benches/locator_plants.py plant a) in a copy
of that tree, and the command naming ``aten::topk`` at the planted line; the baseline's own
run is refused as "no divergence" (exit 2). Real runs (Ray, the smoke workload): ~2 min."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SMOKE = "qwen3_moe_tiny_smoke"


def _plants():
    spec = importlib.util.spec_from_file_location("_locator_plants", REPO / "benches" / "locator_plants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PLANTS


def _copy_tracked(dst: Path) -> None:
    """The checkout's tracked files as they are on disk (uncommitted edits included)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def _golden(tree: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HARNESS_CODE_DIGEST", "HARNESS_CODE_ROOT")}
    env.update(PYTHONPATH=str(tree), GOLDEN_PROGRESS="plain")
    return subprocess.run([sys.executable, "-P", "-m", "harness", *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_locate_names_the_planted_topk_with_its_line(tmp_path):
    repo, plant, goldens = tmp_path / "repo", tmp_path / "plant", tmp_path / "goldens"
    repo.mkdir()
    _copy_tracked(repo)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    (goldens / SMOKE).mkdir(parents=True)
    shutil.copy(repo / "goldens" / SMOKE / "workload.yaml", goldens / SMOKE / "workload.yaml")
    cap = _golden(repo, "capture", SMOKE, "--goldens-root", str(goldens), "--platform", "cpu", "-q",
                  "--run-dir", str(tmp_path / "base"))
    assert cap.returncode == 0, cap.stderr[-3000:]
    golden_dir = goldens / SMOKE / "cpu"

    same = _golden(repo, "locate", str(tmp_path / "base"), str(golden_dir))
    assert same.returncode == 2 and "no divergence to locate" in same.stderr, same.stderr[-2000:]

    shutil.copytree(repo, plant, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    a = _plants()["a"]
    target = plant / a.file
    text = target.read_text()
    assert text.count(a.old) == 1
    target.write_text(text.replace(a.old, a.new))
    run = _golden(plant, "run", SMOKE, "--goldens-root", str(goldens), "--platform", "cpu", "-q",
                  "--run-dir", str(tmp_path / "run"))
    assert run.returncode == 0, run.stderr[-3000:]

    alone = _golden(plant, "locate", str(tmp_path / "run"), str(golden_dir), "--format", "json")
    assert alone.returncode == 2 and "is in no git repository: give --repo" in alone.stderr, alone.stderr[-2000:]

    loc = _golden(plant, "locate", str(tmp_path / "run"), str(golden_dir), "--repo", str(repo), "--format", "json")
    assert loc.returncode == 1, loc.stderr[-3000:] + loc.stdout[-2000:]
    doc = json.loads(loc.stdout)
    assert doc["entry"] == "step0001/forward/mb000/model.layers.2.mlp.gate#0"
    assert doc["op"]["op"] == "aten::topk"
    assert doc["op"]["where"].startswith("harness/parallel/expert.py:")
    assert "torch.topk(probs.to(torch.bfloat16)" in doc["op"]["where"]
    assert [d["op"] for d in doc["derived"]] == ["aten::_to_copy"]
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert len(worktrees.strip().splitlines()) == 1, f"the golden's worktree is removed: {worktrees}"
