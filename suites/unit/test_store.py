"""Golden store: layout, atomic replace, recovery of interrupted writes, lint."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.store import (
    GoldenStoreError,
    atomic,
    lint,
    new_provenance,
    read_golden,
    recover,
    write_golden,
)

PROV = new_provenance(
    commit="d892304",
    reason="initial capture",
    command="golden capture w",
    environment={"device": "cpu"},
    date="2026-11-29T08:00:00+00:00",
)


def _write(root, version=0, **kw):
    docs = synthetic_surfaces("w", seed=version)
    write_golden(root, "w", "cpu", synthetic_manifest("w"), docs, {**PROV, "reason": f"v{version}"}, **kw)
    return docs


def test_write_then_read_round_trips(tmp_path):
    docs = _write(tmp_path, tolerances="version: 1\nrules: []\n")
    golden = read_golden(tmp_path, "w", "cpu")
    assert golden.surfaces == docs and golden.provenance["reason"] == "v0"
    assert golden.tolerances_path == tmp_path / "w/cpu/tolerances.yaml"
    assert [e["path"] for e in golden.manifest["surfaces"]] == [f"surfaces/{n}.json" for n in sorted(docs)]
    assert oct((tmp_path / "w/cpu").stat().st_mode & 0o777) == "0o755"


def test_replace_leaves_no_siblings(tmp_path):
    _write(tmp_path, 0)
    docs = _write(tmp_path, 1)
    assert sorted(os.listdir(tmp_path / "w")) == ["cpu"]
    assert read_golden(tmp_path, "w", "cpu").surfaces == docs


def test_replace_without_renameat2_uses_the_fallback(tmp_path, monkeypatch):
    _write(tmp_path, 0)
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    docs = _write(tmp_path, 1)
    assert sorted(os.listdir(tmp_path / "w")) == ["cpu"]
    assert read_golden(tmp_path, "w", "cpu").surfaces == docs


def test_recovery_restores_old_golden_when_killed_between_fallback_renames(tmp_path):
    docs = _write(tmp_path, 0)
    # The state a fallback writer leaves if killed after rename(target, old), before rename(tmp, target):
    os.rename(tmp_path / "w/cpu", tmp_path / "w/.cpu.old-abc")
    os.mkdir(tmp_path / "w/.cpu.tmp-def")
    (tmp_path / "w/.cpu.tmp-def/manifest.json").write_text("{")
    assert {p.name for p in recover(tmp_path, "w", "cpu")} == {".cpu.old-abc", ".cpu.tmp-def"}
    assert sorted(os.listdir(tmp_path / "w")) == ["cpu"]
    assert read_golden(tmp_path, "w", "cpu").surfaces == docs


def test_invalid_inputs_are_refused_before_touching_disk(tmp_path):
    docs = synthetic_surfaces("w")
    bad = {**docs, "training": {**docs["training"], "sections": {"step0001": {"metrics": {"loss": "x"}}}}}
    with pytest.raises(GoldenStoreError, match="surface training: /sections/step0001/metrics/loss"):
        write_golden(tmp_path, "w", "cpu", synthetic_manifest("w"), bad, PROV)
    with pytest.raises(GoldenStoreError, match="provenance: reason"):
        write_golden(tmp_path, "w", "cpu", synthetic_manifest("w"), docs, {**PROV, "reason": " "})
    with pytest.raises(GoldenStoreError, match="expected 'w'"):
        write_golden(tmp_path, "w", "cpu", synthetic_manifest("other"), docs, PROV)
    with pytest.raises(ValueError, match="invalid platform name"):
        write_golden(tmp_path, "w", "../x", synthetic_manifest("w"), docs, PROV)
    assert not (tmp_path / "w" / "cpu").exists()


def test_read_missing_golden_names_the_path(tmp_path):
    # match="w" alone matched almost any message; name the workload, platform and path
    with pytest.raises(FileNotFoundError, match=re.escape(f"no golden for workload 'w': {tmp_path / 'w'} does not")):
        read_golden(tmp_path, "w", "cpu")
    _write(tmp_path)  # the workload now has a cpu golden, but none for cuda
    with pytest.raises(FileNotFoundError, match=re.escape(f"platform 'cuda': {tmp_path / 'w' / 'cuda'} does not")):
        read_golden(tmp_path, "w", "cuda")


REPO = Path(__file__).resolve().parents[2]


def _workload(root, name, platforms):
    """A real workload spec (the tiny smoke workload) renamed and scheduled on ``platforms``."""
    spec = yaml.safe_load((REPO / "goldens/qwen3_moe_tiny_smoke/workload.yaml").read_text())
    spec["name"] = name
    spec.setdefault("platform", {})["platforms"] = platforms
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "workload.yaml").write_text(yaml.safe_dump(spec))


def test_lint_reports_every_kind(tmp_path):
    _write(tmp_path, 0)
    _workload(tmp_path, "w", ["cpu", "cuda"])                           # cuda missing
    write_golden(tmp_path, "orphan", "cpu", synthetic_manifest("orphan"),
                 synthetic_surfaces("orphan"), PROV)                    # no workload.yaml
    _workload(tmp_path, "v", ["cpu"])
    write_golden(tmp_path, "v", "cpu", synthetic_manifest("v"), synthetic_surfaces("v"), PROV)
    write_golden(tmp_path, "v", "tpu", synthetic_manifest("v"), synthetic_surfaces("v"), PROV)  # unscheduled
    (tmp_path / "v/cpu/PROVENANCE.json").write_text("{not json")
    os.mkdir(tmp_path / "v/.cpu.tmp-zzz")
    (tmp_path / "v/tpu/surfaces/training.json").write_text("{}\n")       # hand-edited
    found = {(f.kind, f.path) for f in lint(tmp_path)}
    assert found == {("missing_golden", "w/cuda"), ("orphan_golden", "orphan/cpu"),
                     ("unscheduled_golden", "v/tpu"), ("bad_provenance", "v/cpu/PROVENANCE.json"),
                     ("leftover_temp", "v/.cpu.tmp-zzz"), ("damaged_golden", "v/tpu")}


def test_lint_clean_store_has_no_findings(tmp_path):
    _write(tmp_path, 0)
    _workload(tmp_path, "w", ["cpu"])
    assert lint(tmp_path) == []


def test_lint_reports_a_broken_workload_spec(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w/workload.yaml").write_text("name: w\n")
    (kind, path), = {(f.kind, f.path) for f in lint(tmp_path)}
    assert (kind, path) == ("bad_workload", "w/workload.yaml")


@pytest.mark.parametrize("damage", ["edited", "truncated", "deleted", "unlisted", "schema_v1"])
def test_read_refuses_a_golden_that_differs_from_its_manifest(tmp_path, damage):
    """A golden is compared only as captured: an edited, truncated, missing or
    extra surface file, or a manifest of another schema version, is an error
    naming the file (it would otherwise read as a regression, or as parity)."""
    _write(tmp_path)
    golden = tmp_path / "w" / "cpu"
    training = golden / "surfaces" / "training.json"
    if damage == "edited":
        training.write_bytes(training.read_bytes().replace(b'"training"', b'"trainin9"'))
    elif damage == "truncated":
        training.write_bytes(training.read_bytes()[:-1])  # still valid JSON: only the newline is gone
    elif damage == "deleted":
        training.unlink()
    elif damage == "unlisted":
        (golden / "surfaces" / "extra.json").write_bytes(training.read_bytes())
    else:
        manifest = golden / "manifest.json"
        manifest.write_bytes(manifest.read_bytes().replace(b'"schema_version":2', b'"schema_version":1'))
    with pytest.raises(GoldenStoreError) as info:
        read_golden(tmp_path, "w", "cpu")
    message = str(info.value)
    expected = {"edited": "training.json: sha256", "truncated": "training.json: sha256",
                "deleted": "training.json: missing", "unlisted": "extra.json: not listed",
                "schema_v1": "schema_version 1"}[damage]
    assert expected in message, message
