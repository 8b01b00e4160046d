"""``golden affected`` / ``harness.footprint.affected``: a change selects exactly the workloads whose
footprint it touches, and everything it cannot prove harmless (a real git repository in tmp_path)."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from harness.footprint.affected import AffectedError, affected

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "goldens" / "qwen3_moe_tiny_smoke" / "workload.yaml"
A, B = "qwen3_moe_tiny_smoke", "qwen3_moe_tiny_other"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _footprint(files: list[str], dirs: list[str], **extra) -> dict:
    doc = {"format": 1, "python": [platform.python_version()], "files": sorted(files), "dirs": sorted(dirs),
           "distributions": {"pyyaml": metadata.version("pyyaml")}, "unresolved": [], "processes": 3,
           "external": 0}
    doc.update(extra)
    return doc


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Two workloads: A read src/model.py and listed src/; B read src/vllm/engine.py and listed src/vllm/."""
    (tmp_path / "src" / "vllm").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "src" / "model.py").write_text("x = 1\n")
    (tmp_path / "src" / "vllm" / "engine.py").write_text("y = 1\n")
    (tmp_path / "docs" / "guide.md").write_text("# guide\n")
    for name, files, dirs in ((A, ["src/model.py"], ["src"]), (B, ["src/vllm/engine.py"], ["src/vllm"])):
        folder = tmp_path / "goldens" / name
        (folder / "cpu").mkdir(parents=True)
        text = SPEC.read_text().replace(f"name: {A}", f"name: {name}")
        (folder / "workload.yaml").write_text(text)
        (folder / "cpu" / "FOOTPRINT.json").write_text(json.dumps(_footprint(files, dirs)))
    _git(tmp_path, "init", "-q")
    _commit(tmp_path, "the code")
    _record_at_head(tmp_path)  # as golden refresh does: the commit the run ran at, then the goldens committed
    return tmp_path


def _commit(repo: Path, message: str) -> None:
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", message)


def _record_at_head(repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD").strip()
    for folder in (repo / "goldens").glob("*/cpu"):
        (folder / "PROVENANCE.json").write_text(json.dumps({"commit": head, "repository": {"commit": head}}))
    _commit(repo, "goldens")


def _selected(repo: Path) -> dict[str, str]:
    return {s.workload: s.reason for s in affected("HEAD", repo / "goldens", "cpu") if s.selected}


def test_a_docs_only_change_selects_nothing(repo):
    (repo / "docs" / "guide.md").write_text("# guide, edited\n")
    (repo / "docs" / "new.md").write_text("new, untracked\n")
    assert _selected(repo) == {}


def test_a_file_in_one_footprint_selects_only_that_workload(repo):
    (repo / "src" / "vllm" / "engine.py").write_text("y = 2\n")
    assert _selected(repo) == {B: "src/vllm/engine.py: read by its run (cpu/FOOTPRINT.json)"}


def test_a_file_added_to_a_listed_folder_selects_its_workload(repo):
    (repo / "src" / "model2.py").write_text("z = 1\n")  # untracked: an import could now find it
    assert list(_selected(repo)) == [A]
    assert "added or removed in src" in _selected(repo)[A]


def test_a_committed_change_since_base_counts(repo):
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "src" / "model.py").write_text("x = 2\n")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "change")
    assert {s.workload for s in affected(base, repo / "goldens", "cpu") if s.selected} == {A}


@pytest.mark.parametrize("path", ["ci/l0.sh", "pyproject.toml", "harness/pytest_plugin.py", "harness/parity/x.py",
                                  "harness/footprint/affected.py", "suites/golden/test_goldens.py"])
def test_gate_and_ci_changes_select_everything(repo, path):
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text("changed\n")
    assert set(_selected(repo)) == {A, B}
    assert all(reason.startswith(path + ":") for reason in _selected(repo).values())


def test_the_workloads_own_folder_selects_it(repo):
    spec = repo / "goldens" / B / "workload.yaml"
    spec.write_text(spec.read_text() + "\n# edited\n")
    assert list(_selected(repo)) == [B]


def test_no_footprint_bad_footprint_other_versions_are_selected(repo):
    (repo / "goldens" / A / "cpu" / "FOOTPRINT.json").unlink()
    doc = _footprint(["src/vllm/engine.py"], [], distributions={"pyyaml": "0.0.1"})
    (repo / "goldens" / B / "cpu" / "FOOTPRINT.json").write_text(json.dumps(doc))
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "footprints")
    got = _selected(repo)
    assert got[A].startswith("no footprint recorded")
    assert got[B] == f"dependency pyyaml: 0.0.1 recorded, {metadata.version('pyyaml')} now"
    for doc, want in ((_footprint([], [], python=["2.7.18"]), "the interpreter"),
                      (_footprint([], [], unresolved=["site-packages/x.py"]), "no installed distribution owns"),
                      ({"format": 1}, "keys must be exactly")):
        (repo / "goldens" / B / "cpu" / "FOOTPRINT.json").write_text(json.dumps(doc))
        _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "footprint")
        assert want in _selected(repo)[B]


def test_a_base_that_does_not_resolve_or_no_git_is_exit_2(repo, tmp_path_factory):
    with pytest.raises(AffectedError, match="BASE 'no-such-rev' does not name a commit"):
        affected("no-such-rev", repo / "goldens", "cpu")
    bare = tmp_path_factory.mktemp("nogit")
    shutil.copytree(repo / "goldens", bare / "goldens")
    with pytest.raises(AffectedError, match="not inside a git work tree"):
        affected("HEAD", bare / "goldens", "cpu")
    cli = [sys.executable, "-m", "harness.cli", "affected", "no-such-rev", f"--goldens-root={repo / 'goldens'}"]
    out = subprocess.run(cli, capture_output=True, text=True, cwd=repo)
    assert out.returncode == 2, out.stderr
    assert "no-such-rev" in out.stderr and "Traceback" not in out.stderr


def test_the_cli_prints_one_workload_per_line_with_its_first_changed_file(repo):
    (repo / "src" / "model.py").write_text("x = 3\n")
    cli = [sys.executable, "-m", "harness.cli", "affected", "HEAD", f"--goldens-root={repo / 'goldens'}",
           "--platform=cpu"]
    out = subprocess.run(cli, capture_output=True, text=True, cwd=repo)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{A}\tsrc/model.py: read by its run (cpu/FOOTPRINT.json)\n"
    assert "1 of 2 workload(s) affected" in out.stderr


def test_a_footprint_recorded_before_a_listed_file_changed_proves_nothing(repo):
    """model.py changed (and was committed) after A's footprint was recorded: the code now may read
    files the footprint does not name, so a change to an unlisted file still selects A until A's
    golden is refreshed. Without the staleness rule A is reported unaffected."""
    (repo / "src" / "model.py").write_text("import helper  # now reads a file the footprint never saw\n")
    (repo / "helper.py").write_text("h = 1\n")
    _commit(repo, "model.py imports helper.py")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "helper.py").write_text("h = 2\n")  # the change under review: a file no footprint lists
    picked = {s.workload: s.reason for s in affected(base, repo / "goldens", "cpu") if s.selected}
    assert list(picked) == [A] and "changed since its footprint was recorded" in picked[A]
    _record_at_head(repo)  # what a refresh does: the footprint is dated again (helper.py would be in it)
    base = _git(repo, "rev-parse", "HEAD").strip()
    assert {s.workload for s in affected(base, repo / "goldens", "cpu") if s.selected} == set()


def test_a_golden_whose_commit_is_not_recorded_or_unknown_is_selected(repo):
    (repo / "goldens" / A / "cpu" / "PROVENANCE.json").write_text(json.dumps({"commit": "0" * 40}))
    (repo / "goldens" / B / "cpu" / "PROVENANCE.json").write_text(json.dumps({"commit": None}))
    _commit(repo, "provenance without a usable commit")
    picked = _selected(repo)
    assert set(picked) == {A, B} and all("cannot be dated" in why for why in picked.values())
