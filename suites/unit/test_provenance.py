"""Provenance of a golden: the consumer repository (commit, dirty), the versions that produced it,
shown by `golden list` and by every report format; older goldens still read, unchanged.

Real git repositories (``git init`` in tmp), real golden stores and the repository's own
stored goldens; nothing here runs a workload.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness import __version__, flows
from harness.cli import main
from harness.parity.comparison import compare
from harness.parity.render import FORMATS, render
from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.postflight.run import PostflightResult
from harness.spec.typed import as_workload
from harness.store import read_golden
from harness.store.provenance import describe, package_versions, provenance_errors, repository_state
from suites.run_dirs import make_run

REPO = Path(__file__).resolve().parents[2]
SMOKE = "qwen3_moe_tiny_smoke"
GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is not installed")  # the image has git: CI runs these


def git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


@pytest.fixture
def consumer(tmp_path: Path) -> Path:
    """A consumer repository with one commit and an (empty) goldens/ folder."""
    repo = tmp_path / "consumer"
    (repo / "goldens").mkdir(parents=True)
    (repo / "README").write_text("x\n")
    git(repo, "init", "-q")
    git(repo, "add", "README")
    git(repo, "commit", "-qm", "init")
    return repo


@needs_git
def test_repository_state_records_commit_and_dirty_flag(consumer):
    head = git(consumer, "rev-parse", "HEAD")
    assert repository_state(consumer / "goldens") == {"commit": head, "dirty": False, "goldens_root": "goldens"}
    (consumer / "README").write_text("changed\n")
    assert repository_state(consumer / "goldens")["dirty"] is True


@needs_git
def test_a_goldens_root_the_repository_ignores_is_recorded_as_none(consumer):
    """A copy of a tree under an ignored folder (e.g. a scratch copy sent to a GPU box)
    is not described by the surrounding repository's commit."""
    (consumer / ".gitignore").write_text("/scratch/\n")
    git(consumer, "add", ".gitignore")
    git(consumer, "commit", "-qm", "ignore scratch")
    (consumer / "scratch" / "tree" / "goldens").mkdir(parents=True)
    assert repository_state(consumer / "scratch" / "tree" / "goldens") is None
    assert repository_state(consumer / "goldens")["commit"] == git(consumer, "rev-parse", "HEAD")


@needs_git
def test_no_repository_is_recorded_as_none(tmp_path):
    outside = tmp_path / "plain"
    outside.mkdir()
    if subprocess.run(["git", "-C", str(outside), "rev-parse"], capture_output=True).returncode == 0:
        pytest.skip("the temporary directory is itself inside a git repository")
    assert repository_state(outside) is None


def test_package_versions_come_from_metadata_without_importing_torch():
    code = ("import sys, json; from harness.store.provenance import package_versions\n"
            "v = package_versions(); print(json.dumps([v, 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    versions, imported = json.loads(out)
    assert imported is False
    from importlib import metadata

    assert versions["torch"] == metadata.version("torch")
    assert versions["harness"] == __version__
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert set(versions) == {"harness", "python", "torch", "megatron-core", "vllm"}


def test_absent_packages_are_recorded_as_absent(monkeypatch):
    from harness.store import provenance

    monkeypatch.setattr(provenance, "_version", lambda dist: None if dist != "torch" else "2.0")
    versions = package_versions()
    assert versions["megatron-core"] is None and versions["vllm"] is None
    assert describe({"versions": versions})["versions"]["vllm"] == "absent"


# The stored golden still in the format before repositories and versions were recorded.
OLD_WORKLOAD, OLD_PLATFORM = "qwen3_moe_tiny_vllm", "cpu-vllm"


def test_provenance_errors_accept_old_and_new_documents_and_name_bad_fields():
    old = json.loads((REPO / "goldens" / OLD_WORKLOAD / OLD_PLATFORM / "PROVENANCE.json").read_text())
    assert "repository" not in old and provenance_errors(old) == []
    new = {**old, "repository": {"commit": "ab" * 20, "dirty": False, "goldens_root": "goldens"},
           "versions": package_versions()}
    assert provenance_errors(new) == []
    assert provenance_errors({**old, "repository": None}) == []
    bad = {**old, "repository": {"commit": "", "dirty": "yes", "goldens_root": "/abs"},
           "versions": {"torch": 2}}
    errors = provenance_errors(bad)
    assert "repository.commit: must be a non-empty string or null" in errors
    assert "repository.dirty: must be true, false or null" in errors
    assert "repository.goldens_root: must be a relative path" in errors
    assert "versions.python: required field is missing" in errors
    assert "versions.torch: must be a version string or null (absent)" in errors


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_old_goldens_still_read_are_described_from_their_environment_and_are_not_rewritten(capsys):
    folder = REPO / "goldens" / OLD_WORKLOAD / OLD_PLATFORM
    before = _tree_digest(folder)
    golden = read_golden(REPO / "goldens", OLD_WORKLOAD, OLD_PLATFORM)
    d = describe(golden.provenance)
    assert d["repository"] == "not recorded" and d["versions_source"] == "environment"
    assert d["versions"]["torch"] == golden.provenance["environment"]["torch"]
    assert main(["list", "--goldens-root", str(REPO / "goldens")]) == 0
    out = capsys.readouterr().out
    assert f"    {OLD_PLATFORM}: captured {golden.provenance['date']}, repository not recorded" in out
    assert _tree_digest(folder) == before


def _execution(tmp_path: Path, workload: str = "w") -> flows.Execution:
    """A complete run as postflight leaves it (synthetic surfaces and manifest)."""
    from harness.manifest import surface_entry
    from harness.surfaces import surface_file_bytes

    run = tmp_path / "run"
    docs = synthetic_surfaces(workload, seed=3)
    (run / "surfaces").mkdir(parents=True)
    for name, doc in docs.items():
        (run / "surfaces" / f"{name}.json").write_bytes(surface_file_bytes(doc))
    manifest = synthetic_manifest(workload)
    manifest["surfaces"] = [surface_entry(run, name) for name in sorted(docs)]
    (run / "manifest.json").write_text(json.dumps(manifest))
    spec = {"name": workload, "platform": {"platforms": ["cpu"], "device": "cpu"},
            "policy": {"backend": "native"}, "rollout": {"backend": "native"}}
    return flows.Execution(as_workload(spec), run, PostflightResult(run, "complete", [], docs), 1.0)


@needs_git
def test_a_capture_records_the_consumer_repository_and_versions(consumer, tmp_path, capsys):
    execution = _execution(tmp_path)
    root = consumer / "goldens"
    (root / "w").mkdir()
    (root / "w" / "workload.yaml").write_text((REPO / "goldens" / SMOKE / "workload.yaml").read_text()
                                              .replace(f"name: {SMOKE}", "name: w"))
    git(consumer, "add", "goldens")
    git(consumer, "commit", "-qm", "spec")
    head = git(consumer, "rev-parse", "HEAD")
    flows.store_golden(execution, "cpu", reason="first", goldens_root=root, command="golden capture w",
                       allow_replace=False)
    prov = read_golden(root, "w", "cpu").provenance
    assert prov["repository"] == {"commit": head, "dirty": False, "goldens_root": "goldens"}
    assert prov["versions"] == package_versions()
    assert main(["list", "--goldens-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"repository {head[:12]} (clean); harness {__version__}, python " in out
    assert main(["list", "--json", "--goldens-root", str(root)]) == 0
    listed = json.loads(capsys.readouterr().out)["workloads"][0]["provenance"]["cpu"]
    assert listed["repository"]["commit"] == head and listed["versions_source"] == "recorded"
    # a refresh over goldens not committed yet is still clean: they are what it writes, not the code
    flows.store_golden(execution, "cpu", reason="again", goldens_root=root, command="golden refresh w",
                       allow_replace=True)
    assert read_golden(root, "w", "cpu").provenance["repository"]["dirty"] is False
    # an uncommitted change to the code outside the goldens root makes it dirty (recorded when allowed)
    (root.parent / "model_change.py").write_text("x = 1\n")
    flows.store_golden(execution, "cpu", reason="again", goldens_root=root, command="golden refresh w",
                       allow_replace=True, allow_dirty=True)
    assert read_golden(root, "w", "cpu").provenance["repository"]["dirty"] is True


def test_a_capture_outside_any_repository_records_none(tmp_path, monkeypatch):
    from harness.store import provenance

    monkeypatch.setattr(provenance, "_git", lambda cwd, *args: None)   # stands in for "no repository here"
    execution = _execution(tmp_path)
    flows.store_golden(execution, "cpu", reason="first", goldens_root=tmp_path / "g", command="c",
                       allow_replace=False)
    prov = read_golden(tmp_path / "g", "w", "cpu").provenance
    assert prov["repository"] is None and prov["commit"] is None
    assert describe(prov)["repository"] == "none"


PROV = {"commit": None, "date": "2026-12-01T10:00:00+00:00", "reason": "r", "command": "c", "environment": {},
        "tolerance_evidence": None, "repository": {"commit": "c0ffee" * 6 + "abcd", "dirty": True,
                                                   "goldens_root": "goldens"},
        "versions": {"harness": "0.1.0", "python": "3.11.7", "torch": "2.13.0+cpu", "megatron-core": None,
                     "vllm": None}}


def test_every_report_format_shows_the_provenance_and_none_without_it():
    docs = synthetic_surfaces("w", seed=1)
    verdict = compare(docs, docs)
    for fmt in FORMATS:
        plain = render(verdict, fmt, title="t", color=False)
        assert render(verdict, fmt, title="t", color=False, provenance=None) == plain
        text = render(verdict, fmt, title="t", color=False, provenance=PROV)
        assert text != plain and "c0ffeec0ffee" in text, fmt
        assert "megatron-core" in text and "absent" in text and "2.13.0+cpu" in text, fmt
    assert "(dirty)" in render(verdict, "terminal", color=False, provenance=PROV)
    props = {p.get("name"): p.get("value")
             for p in ET.fromstring(render(verdict, "junit", provenance=PROV)).iter("property")}
    assert props["golden.repository.commit"] == PROV["repository"]["commit"]
    assert props["golden.repository.dirty"] == "true" and props["golden.version.vllm"] == "absent"
    doc = json.loads(render(verdict, "json", provenance=PROV))
    assert doc["golden_provenance"]["repository"]["dirty"] is True
    assert doc["golden_provenance"]["versions"]["torch"] == "2.13.0+cpu"
    assert '<section id="provenance">' in render(verdict, "html", provenance=PROV)


def test_diff_reports_carry_the_goldens_provenance(tmp_path, capsys):
    root = tmp_path / "goldens"
    shutil.copytree(REPO / "goldens" / OLD_WORKLOAD / OLD_PLATFORM, root / OLD_WORKLOAD / OLD_PLATFORM)
    golden = read_golden(root, OLD_WORKLOAD, OLD_PLATFORM)
    run = make_run(tmp_path / "run", golden.surfaces)  # a complete run whose surfaces equal the golden's
    out = tmp_path / "r.json"
    assert main(["diff", str(run), str(root / OLD_WORKLOAD / OLD_PLATFORM), "--output", str(out)]) == 0
    shown = json.loads(out.read_text())["golden_provenance"]
    assert shown["date"] == golden.provenance["date"] and shown["repository"] == "not recorded"
