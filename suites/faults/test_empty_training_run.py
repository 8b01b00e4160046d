"""A run whose staging returns before its commit trains on nothing: it must end
as failed, and no golden command may take it (issue 23 item 2).

One real run (``golden capture`` in a subprocess: Ray, the policy worker, the
rollout engine, the data plane) with the planted regression
``suites.faults.planted.stage_returns_before_commit`` in every Ray worker:
every staged row is acknowledged but never committed, so every sample of step
1 is masked at finalisation. Before the verified-sample check this run printed
``loss=0.00000``, ended "complete" and was stored as a golden (the same
command with ``grpo.min_verified_samples=0`` still does).

``golden refresh`` and ``golden check`` are then given that same failed run
directory (``flows.execute`` replays it instead of running the workload twice
more): what is under test there is how they treat a failed run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import flows
from harness.cli import EXIT_NO_VERDICT, main
from harness.postflight.run import postflight
from harness.spec.load import load_spec
from suites.stored_goldens import copy_stored

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SMOKE = "qwen3_moe_tiny_smoke"
SMALL = ("grpo.iterations=1", "plugins.policy_profiler=null", "plugins.rollout_profiler=null")
REASON = ("EmptyTrainingStep: step 1: 0 of 16 samples verified, fewer than grpo.min_verified_samples = 1: "
          "the step is not trained and the run fails. Masked: 16 by verification failed (fetch_failed:KeyError), "
          "e.g. step0001-attempt1-row0000")


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("empty_training")
    goldens = tmp / "goldens"
    (goldens / SMOKE).mkdir(parents=True)
    shutil.copy(REPO / "goldens" / SMOKE / "workload.yaml", goldens / SMOKE / "workload.yaml")
    env = dict(os.environ, RAY_AUTH_MODE="disabled",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
               GOLDEN_WORKER_SETUP_HOOK="suites.faults.planted.stage_returns_before_commit")
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "capture", SMOKE, *SMALL, "--goldens-root", str(goldens),
         "--run-dir", str(tmp / "run"), "--platform", "cpu"],
        env=env, capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    return goldens, tmp / "run", proc


def test_a_step_with_no_verified_sample_fails_the_run(failed_run):
    _, run_dir, proc = failed_run
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "failed", proc.stderr
    assert run["error"] == REASON
    assert not (run_dir / "metrics.jsonl").exists()  # nothing was trained, no step was logged
    assert "loss=" not in proc.stderr


def test_capture_refuses_the_run_and_stores_nothing(failed_run):
    goldens, run_dir, proc = failed_run
    assert proc.returncode == EXIT_NO_VERDICT, proc.stderr
    assert f"FAIL run_completed: {REASON}" in proc.stderr
    assert "the run did not complete, so there is no verdict" in proc.stderr
    assert not (goldens / SMOKE / "cpu").exists()
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"


@pytest.mark.parametrize("command", ["refresh", "check"])
def test_refresh_and_check_give_no_verdict_for_it(failed_run, command, tmp_path, monkeypatch, capsys):
    _, run_dir, _ = failed_run
    goldens = tmp_path / "goldens"
    (goldens / SMOKE).mkdir(parents=True)
    shutil.copy(REPO / "goldens" / SMOKE / "workload.yaml", goldens / SMOKE / "workload.yaml")
    copy_stored(SMOKE, goldens)
    before = sorted((p.relative_to(goldens), p.read_bytes()) for p in goldens.rglob("*") if p.is_file())
    replay = tmp_path / "replayed"
    shutil.copytree(run_dir, replay, ignore=shutil.ignore_patterns("*.sock"))  # a refit socket left in ipc/

    def execute(workload, **kwargs):  # the failed run, postflighted again
        spec = load_spec(workload, kwargs.get("overrides", ()), goldens_root=kwargs.get("goldens_root"))
        return flows.Execution(spec, replay, postflight(replay), 0.0)

    monkeypatch.setattr(flows, "execute", execute)
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    # no overrides: the stored golden records its spec, and a check whose spec differs is decided
    # (a spec finding) before any run; the replayed run is the failed one whatever they say
    args = [command, SMOKE, "--goldens-root", str(goldens), "--run-dir", str(tmp_path / "new"), "-q"]
    if command == "refresh":
        args += ["--reason", "must not be stored"]
    assert main(args) == EXIT_NO_VERDICT
    err = capsys.readouterr().err
    assert f"FAIL run_completed: {REASON}" in err and "no verdict" in err
    assert sorted((p.relative_to(goldens), p.read_bytes()) for p in goldens.rglob("*") if p.is_file()) == before
