"""Manifest v2: every malformed fixture is rejected at its expected JSON pointer."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from harness.manifest import (
    ManifestInvalid,
    load_manifest,
    new_manifest,
    sha256_file,
    validate_manifest,
)
from harness.surfaces import StrictJSONError, loads_strict

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "manifests_invalid"
RUN_DIR = FIXTURES / "_run"
EXPECTED = json.loads((FIXTURES / "EXPECTED.json").read_text())


def _errors_for(case: str):
    text = (FIXTURES / case).read_text()
    try:
        doc = loads_strict(text)
    except StrictJSONError as exc:
        return [(exc.pointer, str(exc))]
    return [(e.pointer, e.message) for e in validate_manifest(doc, base_dir=RUN_DIR)]


def test_there_are_at_least_ten_malformed_fixtures():
    assert len(EXPECTED) >= 10
    assert sorted(EXPECTED) == sorted(p.name for p in FIXTURES.glob("*.json") if p.name != "EXPECTED.json")


def test_the_base_manifest_is_valid():
    assert load_manifest(RUN_DIR / "manifest.json")["schema_version"] == 2


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_malformed_fixture_is_rejected_at_its_pointer(case):
    expected = EXPECTED[case]
    errors = _errors_for(case)
    assert errors, f"{case} was accepted"
    matching = [msg for pointer, msg in errors if pointer == expected["pointer"]]
    assert matching, f"{case}: no error at {expected['pointer']}; got {errors}"
    assert any(expected["contains"] in msg for msg in matching), (case, matching)


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_load_manifest_raises_with_every_error_listed(tmp_path, case):
    # Copy the run dir so file checks still resolve, and put the case in as manifest.json.
    import shutil

    run = tmp_path / "run"
    shutil.copytree(RUN_DIR, run)
    (run / "manifest.json").write_bytes((FIXTURES / case).read_bytes())
    with pytest.raises(ManifestInvalid) as info:
        load_manifest(run / "manifest.json")
    assert EXPECTED[case]["pointer"] in {e.pointer for e in info.value.errors}
    assert str(run / "manifest.json") in str(info.value)


def test_unsupported_version_names_found_and_supported():
    doc = json.loads((RUN_DIR / "manifest.json").read_text())
    doc["schema_version"] = 1
    (err,) = validate_manifest(doc)
    assert err.pointer == "/schema_version"
    assert "schema_version 1 is not supported" in err.message and "schema_version 2" in err.message


def test_python_nan_in_dict_is_refused_with_pointer():
    doc = json.loads((RUN_DIR / "manifest.json").read_text())
    doc["environment"]["backends"]["policy"] = math.nan
    (err,) = validate_manifest(doc)
    assert err.pointer == "/environment/backends/policy"


def test_symlink_escaping_base_dir_is_refused(tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(RUN_DIR, run)
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes((run / "artifacts/policy/rank00000.trace.jsonl").read_bytes())
    target = run / "artifacts/policy/rank00000.trace.jsonl"
    target.unlink()
    target.symlink_to(outside)
    doc = json.loads((run / "manifest.json").read_text())
    errors = validate_manifest(doc, base_dir=run)
    assert [e.pointer for e in errors] == ["/artifacts/0/path"]
    assert "outside" in errors[0].message


def test_golden_mode_skips_artifact_files_but_checks_surfaces(tmp_path):
    import shutil

    golden = tmp_path / "golden"
    shutil.copytree(RUN_DIR / "surfaces", golden / "surfaces")
    doc = json.loads((RUN_DIR / "manifest.json").read_text())
    assert validate_manifest(doc, base_dir=golden, check_artifact_files=False) == []
    (golden / "surfaces/training.json").write_text("{}\n")
    errors = validate_manifest(doc, base_dir=golden, check_artifact_files=False)
    assert [e.pointer for e in errors] == ["/surfaces/0/sha256"]


def test_new_manifest_round_trips_through_validation():
    base = json.loads((RUN_DIR / "manifest.json").read_text())
    rebuilt = new_manifest(
        run_id=base["run_id"], workload=base["workload"]["name"], spec_digest=base["workload"]["spec_digest"],
        harness_version=base["harness"]["version"], git_commit=base["harness"]["git_commit"],
        environment=base["environment"], topology=base["topology"], plugins=base["plugins"],
        iterations=base["iterations"], status=base["status"], artifacts=base["artifacts"],
        surfaces=base["surfaces"], checks=base["checks"])
    assert rebuilt == base
    assert validate_manifest(copy.deepcopy(rebuilt), base_dir=RUN_DIR) == []


def test_sha256_file_matches_manifest_entry():
    doc = json.loads((RUN_DIR / "manifest.json").read_text())
    entry = doc["artifacts"][0]
    assert sha256_file(RUN_DIR / entry["path"]) == entry["sha256"]


def test_duplicate_keys_are_refused():
    with pytest.raises(StrictJSONError, match="duplicate object key 'a'"):
        loads_strict('{"a": 1, "a": 2}')
