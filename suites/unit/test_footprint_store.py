"""A golden's FOOTPRINT.json: stored by write_golden (validated first), locked, read back, and a
damaged one makes the golden unusable (named), never a silently empty footprint."""

from __future__ import annotations

import json

import pytest

from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.store import GoldenStoreError, read_golden, write_golden
from harness.store.integrity import golden_problems
from harness.store.lock import read_lock
from suites.unit.test_footprint_affected import _footprint
from suites.unit.test_store import PROV


def test_the_footprint_is_stored_locked_and_validated(tmp_path):
    doc = _footprint(["harness/ops.py"], ["harness"])
    target = write_golden(tmp_path, "w", "cpu", synthetic_manifest("w"), synthetic_surfaces("w"), PROV, footprint=doc)
    assert json.loads((target / "FOOTPRINT.json").read_text()) == doc
    assert "FOOTPRINT.json" in read_lock(tmp_path)["w/cpu"]["files"]
    read_golden(tmp_path, "w", "cpu")  # reads cleanly
    with pytest.raises(GoldenStoreError, match=r"FOOTPRINT.json: keys must be exactly"):
        write_golden(tmp_path, "w", "cpu", synthetic_manifest("w"), synthetic_surfaces("w"), PROV,
                     footprint={"files": []})


def test_a_damaged_footprint_is_named_by_the_stored_golden_checks(tmp_path):
    target = write_golden(tmp_path, "w", "cpu", synthetic_manifest("w"), synthetic_surfaces("w"), PROV,
                          footprint=_footprint([], []))
    files = {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    files["FOOTPRINT.json"] = json.dumps({**_footprint([], []), "files": ["/abs/path.py"]}).encode()
    manifest = json.loads(files["manifest.json"])
    surfaces = {name: json.loads(files[f"surfaces/{name}.json"]) for name in synthetic_surfaces("w")}
    problems = golden_problems(target, manifest, files, surfaces)
    assert any("FOOTPRINT.json#/files: paths must be repository-relative" in p for p in problems), problems
