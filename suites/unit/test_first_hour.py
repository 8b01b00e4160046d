"""Small things a consumer meets in the first hour (issue 40), each as the consumer sees it.

* ``golden COMMAND | head`` ends quietly (exit 141, no BrokenPipe traceback), for every command
  that prints;
* ``--golden-strict-unused`` with no golden test collected names the unused goldens and fails
  (exit 1), instead of pytest's "no tests" (exit 5);
* the HTML provenance says why ``commit`` is null;
* the "workload half not installed" advice names the pip extra, not ``ci/bootstrap.sh``;
* ``golden lint``'s missing-golden finding says what to do (capture there, or drop the platform);
* pytest ``--golden-refresh`` shows what changed against the golden it replaced (slow: one run).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suites.inner_golden import REPO, SMOKE
from suites.stored_goldens import copy_stored

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("command", [["list"], ["plan", SMOKE], ["lint"], ["--help"], ["validate", "--help"]])
def test_a_closed_pipe_ends_a_command_quietly(command, tmp_path: Path):
    args = " ".join(command)
    script = f"'{sys.executable}' -m harness.cli {args} | true"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr


def test_strict_unused_with_no_golden_test_collected_names_them(pytester: pytest.Pytester, monkeypatch):
    monkeypatch.setenv("GOLDEN_PRESTART", "0")
    for name in ("GOLDEN_PLATFORM", "GOLDEN_ROOT"):
        monkeypatch.delenv(name, raising=False)
    root = pytester.path / "goldens"
    copy_stored(SMOKE, root, as_workload="removed")
    pytester.makepyfile(test_other="def test_other():\n    pass\n")
    result = pytester.runpytest_subprocess("-m", "golden", "-p", "no:cacheprovider", f"--goldens-root={root}",
                                           "--golden-strict-unused")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out[-2000:]
    assert f"{root}/removed/" in out and "no test targets this golden" in out
    assert "they fail the session (--golden-strict-unused)" in out
    lenient = pytester.runpytest_subprocess("-m", "golden", "-p", "no:cacheprovider", f"--goldens-root={root}")
    assert lenient.ret == pytest.ExitCode.NO_TESTS_COLLECTED  # without the flag: pytest's own verdict


def test_the_html_provenance_says_why_commit_is_none():
    from harness.parity.render.html_provenance import provenance_block

    html = provenance_block({"commit": None, "command": "golden capture w", "date": "2026-01-01T00:00:00+00:00",
                             "reason": "r", "environment": {}, "tolerance_evidence": None})
    assert 'data-field="commit">(none: the harness that stored this golden did not run from a git checkout' in html


def test_the_workload_half_advice_names_the_pip_extra():
    text = (REPO / "harness" / "cli" / "_workload_args.py").read_text()
    assert "grpo-golden-harness[workload]" in text and "run ci/bootstrap.sh\"" not in text


def test_lint_says_what_to_do_about_an_uncaptured_platform(tmp_path: Path):
    from harness.store.lint import lint

    root = tmp_path / "goldens"
    copy_stored(SMOKE, root)
    shutil.copy(REPO / "goldens" / SMOKE / "workload.yaml", root / SMOKE / "workload.yaml")  # [cpu, cuda]
    (finding,) = [f for f in lint(root) if f.kind == "missing_golden"]
    assert finding.path == f"{SMOKE}/cuda"
    assert f"golden capture {SMOKE} --platform cuda" in finding.message
    assert f"remove 'cuda' from platform.platforms in {root / SMOKE / 'workload.yaml'}" in finding.message


@pytest.mark.slow
def test_pytest_refresh_shows_what_changed(pytester: pytest.Pytester, monkeypatch):
    """A refresh after a seed change: the session lists, under "golden refresh: what changed",
    the run against the golden it replaced (findings and the spec note) before one commits it."""
    from suites.inner_golden import INNER_GOLDEN_TEST

    for name in ("GOLDEN_PLATFORM", "GOLDEN_ROOT"):
        monkeypatch.delenv(name, raising=False)
    root = pytester.path / "goldens"
    copy_stored(SMOKE, root)
    spec = (REPO / "goldens" / SMOKE / "workload.yaml").read_text().replace("seed: 1234", "seed: 1235")
    (root / SMOKE / "workload.yaml").write_text(spec)
    pytester.makepyfile(test_inner=INNER_GOLDEN_TEST.format(root=str(root)))
    result = pytester.runpytest_subprocess("-m", "golden", "-p", "no:cacheprovider", f"--goldens-root={root}",
                                           "--golden-refresh", "--golden-reason=seed moved")
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    section = out[out.index("golden refresh: what changed"):]
    assert f"{SMOKE}/" in section and "replaced golden -> this run" in section
    assert "training" in section and "FAIL" in section
    provenance = json.loads(next((root / SMOKE).glob("cpu*/PROVENANCE.json")).read_text())
    assert provenance["reason"] == "seed moved" and provenance["spec"]["seed"] == 1235


def test_run_directories_go_to_one_place_outside_the_working_directory(monkeypatch, tmp_path: Path):
    """``runs_root()``: ``$GOLDEN_RUNS``, else ``$XDG_CACHE_HOME/grpo-golden-harness/runs``, else
    ``~/.cache/grpo-golden-harness/runs``; never relative to the working directory (it was
    ``runs/`` in the cwd, a consumer's checkout)."""
    from harness import flows

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GOLDEN_RUNS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert flows.runs_root() == tmp_path / "cache" / "grpo-golden-harness" / "runs"
    assert flows.default_run_dir("w").parent == flows.runs_root()
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert flows.runs_root() == Path.home() / ".cache" / "grpo-golden-harness" / "runs"
    monkeypatch.setenv("GOLDEN_RUNS", "mine")
    assert flows.runs_root() == tmp_path / "mine"  # configured: made absolute, announced as such
