"""``pytest -m golden --golden-since=BASE`` in an inner pytest session over a real git repository:
the unaffected workloads' tests are deselected and reported as not affected (never as passed), a
session with nothing affected says that nothing ran and exits 0, a bad BASE is a usage error."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from suites.unit.test_footprint_affected import A, B, _footprint, _git

REPO = Path(__file__).resolve().parents[2]
TESTS = '''
import pytest
from harness.pytest_plugin import golden_params

@pytest.mark.golden
@pytest.mark.parametrize("workload,surface", golden_params())
def test_golden(golden, workload, surface):
    golden.check(workload, surface)

@pytest.mark.golden
@pytest.mark.golden_uses("{b}", files=("src/planted.py",))
def test_self_check_of_b():
    pass
'''


@pytest.fixture
def consumer(tmp_path: Path) -> Path:
    spec = (REPO / "goldens" / A / "workload.yaml").read_text()
    for name, files in ((A, ["src/model.py"]), (B, ["src/vllm/engine.py"])):
        folder = tmp_path / "goldens" / name / "cpu"
        folder.mkdir(parents=True)
        (folder.parent / "workload.yaml").write_text(spec.replace(f"name: {A}", f"name: {name}"))
        (folder / "FOOTPRINT.json").write_text(json.dumps(_footprint(files, [])))
    (tmp_path / "src" / "vllm").mkdir(parents=True)
    (tmp_path / "src" / "model.py").write_text("x = 1\n")
    (tmp_path / "src" / "vllm" / "engine.py").write_text("y = 1\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# guide\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_goldens.py").write_text(TESTS.replace("{b}", B))
    (tmp_path / "pyproject.toml").write_text('[tool.golden]\ngoldens-root = "goldens"\n')
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
    head = _git(tmp_path, "rev-parse", "HEAD").strip()  # as a refresh records it: the commit the run ran at
    for name in (A, B):
        (tmp_path / "goldens" / name / "cpu" / "PROVENANCE.json").write_text(json.dumps({"commit": head}))
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "goldens")
    return tmp_path


def _pytest(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GOLDEN_"))}
    env["CI"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "golden", "tests", *args],
                          capture_output=True, text=True, cwd=repo, env=env, timeout=300)


def test_a_docs_only_change_runs_nothing_and_says_so(consumer):
    (consumer / "docs" / "guide.md").write_text("# edited\n")
    out = _pytest(consumer, "--golden-since=HEAD")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert f"{A:<36} not affected (not run, not passed)" in text and f"{B:<36} not affected" in text
    assert "0 of 2 workload(s) affected since HEAD; 15 test(s) deselected" in text
    assert "NOTHING WAS RUN" in text
    assert not re.search(r"\d+ passed", text) and "15 deselected in" in text


def test_only_the_affected_workloads_tests_are_collected(consumer):
    (consumer / "src" / "vllm" / "engine.py").write_text("y = 2\n")
    out = _pytest(consumer, "--golden-since=HEAD", "--collect-only", "-q")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    collected = [line for line in out.stdout.splitlines() if "::" in line]
    assert collected and all(B in line or "self_check_of_b" in line for line in collected), collected
    assert len(collected) == 8  # B's seven surfaces and B's self-check
    assert f"{B:<36} affected: src/vllm/engine.py: read by its run" in text
    assert f"{A:<36} not affected (not run, not passed)" in text


def test_a_golden_uses_test_runs_when_its_file_changed(consumer):
    (consumer / "src" / "planted.py").write_text("p = 1\n")
    out = _pytest(consumer, "--golden-since=HEAD", "--collect-only", "-q")
    collected = [line for line in out.stdout.splitlines() if "::" in line]
    assert collected == ["tests/test_goldens.py::test_self_check_of_b"], out.stdout + out.stderr


def test_a_base_that_does_not_resolve_is_a_usage_error_naming_it(consumer):
    out = _pytest(consumer, "--golden-since=no-such-rev")
    assert out.returncode == 4, out.stdout + out.stderr
    assert "--golden-since no-such-rev: BASE 'no-such-rev' does not name a commit" in out.stderr
