"""The gate fails closed (issue 16): every case of the issue's "Why", end to end through `golden`.

Each test builds a real run directory / golden (as postflight and the store leave them)
and runs the real command in-process. Tests that must prove a file outside the run
directory is never opened record every path opened while the command runs.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.parity.synthetic import synthetic_surfaces
from harness.store import new_provenance, write_golden
from harness.surfaces import surface_file_bytes
from suites.run_dirs import OpenLog, make_run, read_manifest, write_manifest


@pytest.fixture
def world(tmp_path):
    docs = synthetic_surfaces("w", seed=5)
    run = make_run(tmp_path / "run", docs)
    golden = write_golden(tmp_path / "goldens", "w", "cpu", read_manifest(run), docs,
                          new_provenance(commit=None, reason="test", command="pytest", environment={}))
    return tmp_path, run, golden, docs


def outside_copy(tmp_path: Path, run: Path, name: str = "operators") -> Path:
    """A file outside the run directory that *would* be compared if it were read:
    the run's own surface with a planted change (reading it gives findings)."""
    doc = json.loads((run / "surfaces" / f"{name}.json").read_text())
    section = next(iter(doc["sections"].values()))
    counts = next(iter(section["phases"].values()))["operators"]
    counts[next(iter(counts))] += 1  # schema-valid, so it would be compared
    outside = tmp_path / "elsewhere" / f"{name}.json"
    outside.parent.mkdir(exist_ok=True)
    outside.write_bytes(surface_file_bytes(doc))
    return outside


# --- 1. diff never looked at the manifest: artifacts[0].path = /etc/passwd gave PARITY ------

def test_diff_refuses_an_artifact_path_outside_the_run(world, capsys):
    _, run, golden, _ = world
    manifest = read_manifest(run)
    manifest["artifacts"][0]["path"] = "/etc/passwd"
    write_manifest(run, manifest)
    assert main(["validate", str(run)]) == 1
    capsys.readouterr()
    assert main(["diff", str(run), str(golden)]) == 2  # main: 0, PARITY
    err = capsys.readouterr().err
    assert "#/artifacts/0/path: path '/etc/passwd' is absolute" in err
    assert "nothing was compared" in err


# --- 2. surface paths that escape are neither compared (diff) nor opened (validate, diff) -----

@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_escaping_surface_paths_are_refused_and_never_opened(world, monkeypatch, capsys, how):
    tmp_path, run, golden, _ = world
    outside = outside_copy(tmp_path, run, "operators")
    manifest = read_manifest(run)
    index = next(i for i, e in enumerate(manifest["surfaces"]) if e["name"] == "operators")
    digest = hashlib.sha256(outside.read_bytes()).hexdigest()
    if how == "absolute":
        manifest["surfaces"][index].update(path=str(outside), sha256=digest)
    elif how == "dotdot":
        manifest["surfaces"][index].update(path="../elsewhere/operators.json", sha256=digest)
    else:
        (run / "surfaces/operators.json").unlink()
        (run / "surfaces/operators.json").symlink_to(outside)
        manifest["surfaces"][index]["sha256"] = digest
    write_manifest(run, manifest)
    log = OpenLog().install(monkeypatch)
    assert main(["validate", str(run)]) == 1
    out = capsys.readouterr().out
    assert f"#/surfaces/{index}/path: " in out
    assert main(["diff", str(run), str(golden)]) == 2  # main: 1 with the planted section compared
    err = capsys.readouterr().err
    assert f"#/surfaces/{index}/path: " in err and "nothing was compared" in err
    assert log.opened(run / "manifest.json"), "the open log recorded nothing (the check below would be vacuous)"
    assert not log.opened(outside), f"{outside} was opened"


def test_a_symlinked_manifest_pointing_outside_is_not_read(world, monkeypatch, capsys):
    tmp_path, run, golden, _ = world
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(run / "manifest.json", elsewhere / "manifest.json")
    (run / "manifest.json").symlink_to(elsewhere / "manifest.json")
    log = OpenLog().install(monkeypatch)
    assert main(["validate", str(run)]) == 1
    assert "resolves outside" in capsys.readouterr().out
    assert main(["diff", str(run), str(golden)]) == 2
    assert "resolves outside" in capsys.readouterr().err
    assert not log.opened(elsewhere / "manifest.json")


def test_a_run_directory_without_a_manifest_is_unusable(world, capsys):
    _, run, golden, _ = world
    (run / "manifest.json").unlink()
    assert main(["diff", str(run), str(golden)]) == 2
    assert "no manifest.json" in capsys.readouterr().err


# --- 3. an interrupted run got 106 "regressions" (exit 1) instead of no verdict (exit 3) -------

def test_diff_of_an_interrupted_run_is_no_verdict(world, tmp_path, capsys):
    _, _, golden, docs = world
    partial = copy.deepcopy(docs)
    partial["training"]["sections"] = dict(list(partial["training"]["sections"].items())[:1])
    checks = [{"name": "run_completed", "outcome": "fail", "detail": "interrupted (Ctrl-C or SIGTERM)"},
              {"name": "metrics_complete", "outcome": "fail", "detail": "steps logged [1], expected 1..3"}]
    run = make_run(tmp_path / "interrupted", partial, status="failed", run_status="failed", checks=checks)
    assert main(["diff", str(run), str(golden)]) == 3  # main: 1, findings
    err = capsys.readouterr().err
    assert "no verdict" in err
    assert "manifest.json#/status: 'failed'" in err
    assert "check run_completed failed: interrupted (Ctrl-C or SIGTERM)" in err
    assert "run.json#/status: 'failed'" in err


def test_a_complete_manifest_with_a_failed_run_json_is_no_verdict(world, capsys):
    _, run, golden, _ = world
    (run / "run.json").write_text(json.dumps({"status": "running", "error": None}))
    assert main(["diff", str(run), str(golden)]) == 3
    assert "run.json#/status: 'running'" in capsys.readouterr().err


# --- 4. documents without size or depth limit: RecursionError / MemoryError tracebacks --------

def nested(depth: int) -> bytes:
    return b'{"surface": "operators", "version": 1, "workload": "w", "sections": {"x": ' + \
        b"[" * depth + b"]" * depth + b"}}\n"


def rehash(run: Path, name: str) -> int:
    """Update the run's manifest entry of ``name`` to the file's current bytes; its index."""
    manifest = read_manifest(run)
    index = next(i for i, e in enumerate(manifest["surfaces"]) if e["name"] == name)
    manifest["surfaces"][index]["sha256"] = hashlib.sha256((run / "surfaces" / f"{name}.json").read_bytes()).hexdigest()
    write_manifest(run, manifest)
    return index


def test_a_deeply_nested_surface_is_refused_with_its_pointer(world, capsys):
    _, run, golden, _ = world
    (run / "surfaces/operators.json").write_bytes(nested(100_000))  # main: RecursionError traceback
    rehash(run, "operators")
    assert main(["validate", str(run)]) == 1
    captured = capsys.readouterr()
    assert "operators.json#/sections/x/0/0/0" in captured.out and "nested deeper than 64 levels" in captured.out
    assert "Traceback" not in captured.err
    assert main(["diff", str(run), str(golden)]) == 2
    captured = capsys.readouterr()
    assert "nested deeper than 64 levels" in captured.err and "Traceback" not in captured.err


def test_a_document_over_the_byte_limit_is_refused_before_it_is_read(world, monkeypatch, capsys):
    _, run, golden, _ = world
    monkeypatch.setenv("GOLDEN_DOC_MAX_BYTES", str(64 * 1024))
    doc = json.loads((run / "surfaces/operators.json").read_text())
    doc["sections"]["big"] = {"coords": {}, "phases": {f"p{i}": {"outcome": "finished", "operators": {"a": i}}
                                                      for i in range(5000)}}
    (run / "surfaces/operators.json").write_bytes(surface_file_bytes(doc))
    rehash(run, "operators")
    assert main(["diff", str(run), str(golden)]) == 2  # main: no limit, read and compared (exit 1)
    err = capsys.readouterr().err
    assert "operators.json#/: surface operators is" in err and "over the limit of 65536 bytes" in err


def test_a_document_too_dense_for_the_memory_limit_is_refused(world, monkeypatch, capsys):
    _, run, golden, _ = world
    monkeypatch.setenv("GOLDEN_DOC_MAX_MEMORY", str(8 << 20))
    (run / "surfaces/operators.json").write_bytes(b"[" + b"{}," * 200_000 + b"{}]\n")
    rehash(run, "operators")
    assert main(["diff", str(run), str(golden)]) == 2
    assert "too many values to parse within the memory limit" in capsys.readouterr().err


def test_a_schema_error_on_a_huge_array_prints_a_short_message(world, capsys):
    _, run, golden, _ = world
    doc = json.loads((run / "surfaces/training.json").read_text())
    doc["sections"] = [0] * 300_000  # must be an object
    (run / "surfaces/training.json").write_bytes(surface_file_bytes(doc))
    rehash(run, "training")
    assert main(["validate", str(run)]) == 1
    out = capsys.readouterr().out
    assert "training.json#/sections: " in out
    assert len(out) < 5_000, f"{len(out)} characters printed"  # main: ~900 kB
    assert main(["diff", str(run), str(golden)]) == 2
    err = capsys.readouterr().err
    assert "training.json#/sections: " in err and len(err) < 5_000


# --- 5. lint crashed on NaN / duplicate keys and passed schema-invalid or incomplete goldens ---

def store_surface(golden: Path, name: str, data: bytes | None) -> None:
    """Replace (or with None remove) a stored surface and keep the manifest's sha256s matching."""
    manifest = json.loads((golden / "manifest.json").read_text())
    path = golden / "surfaces" / f"{name}.json"
    if data is None:
        path.unlink()
        manifest["surfaces"] = [e for e in manifest["surfaces"] if e["name"] != name]
    else:
        path.write_bytes(data)
        for entry in manifest["surfaces"]:
            if entry["name"] == name:
                entry["sha256"] = hashlib.sha256(data).hexdigest()
    (golden / "manifest.json").write_bytes(surface_file_bytes(manifest))


@pytest.mark.parametrize("case,data,expect", [
    ("nan", (b'{"surface":"training","version":1,"workload":"w","sections":{"step0001":{"step":1,'
            b'"metrics":{"loss":NaN}}}}\n'), "training.json#/sections/step0001/metrics/loss: non-finite token NaN"),
    ("duplicate", b'{"surface":"training","version":1,"workload":"w","workload":"w","sections":{}}\n',
     "training.json#/workload: duplicate object key 'workload'"),
    ("schema", b'{"surface":"training","version":1,"workload":"w","sections":{"step0001":{"step":"one"}}}\n',
     "training.json#/sections/step0001"),
    ("missing", None, "gated surface 'training' is missing"),
])
def test_lint_reports_damaged_goldens_without_crashing(world, capsys, case, data, expect):
    tmp_path, _, golden, _ = world
    root = tmp_path / "goldens"
    shutil.copy(Path(__file__).resolve().parents[2] / "goldens/qwen3_moe_tiny_smoke/workload.yaml",
                root / "w" / "workload.yaml")
    spec = (root / "w/workload.yaml").read_text().replace("name: qwen3_moe_tiny_smoke", "name: w")
    spec = spec.replace("platforms: [cpu, cuda]", "platforms: [cpu]")
    (root / "w/workload.yaml").write_text(spec)
    assert main(["lint", "--goldens-root", str(root)]) == 0, capsys.readouterr()
    capsys.readouterr()
    store_surface(golden, "training", data)
    assert main(["lint", "--goldens-root", str(root)]) == 1  # main: traceback (nan, duplicate) or ok (schema, missing)
    captured = capsys.readouterr()
    assert "damaged_golden: w/cpu: " in captured.out and expect in captured.out
    assert "Traceback" not in captured.err
    assert main(["diff", str(tmp_path / "run"), str(golden)]) == 2  # the store refuses it too


def test_a_symlink_inside_a_golden_is_refused(world, tmp_path, capsys):
    _, run, golden, _ = world
    target = golden / "surfaces/training.json"
    outside = tmp_path / "training-elsewhere.json"
    shutil.move(target, outside)
    target.symlink_to(outside)
    assert main(["diff", str(run), str(golden)]) == 2
    assert "is a symlink" in capsys.readouterr().err
