"""Manifest path rules as properties: escaping paths are always refused, safe ones never."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from harness.manifest import validate_manifest
from harness.parity.synthetic import synthetic_manifest

segment = st.text(alphabet="abcdefgh0123456789_-.", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
safe_paths = st.lists(segment, min_size=1, max_size=4).map("/".join)
BASE = synthetic_manifest("w")


def with_artifact(path: str) -> dict:
    doc = copy.deepcopy(BASE)
    doc["artifacts"] = [{"path": path, "role": "policy", "rank": 0, "sha256": "0" * 64, "bytes": 1}]
    return doc


@given(safe_paths)
def test_relative_paths_without_dotdot_are_accepted(path):
    assert validate_manifest(with_artifact(path)) == []


@given(st.lists(segment, max_size=3), st.lists(segment, max_size=3))
def test_dotdot_anywhere_is_refused(before, after):
    path = "/".join(before + [".."] + after)
    pointers = [e.pointer for e in validate_manifest(with_artifact(path))]
    assert pointers == ["/artifacts/0/path"]


@given(safe_paths)
def test_absolute_paths_are_refused(path):
    pointers = [e.pointer for e in validate_manifest(with_artifact("/" + path))]
    assert pointers == ["/artifacts/0/path"]


@given(st.integers().filter(lambda v: v != 2) | st.text(max_size=3) | st.none() | st.floats(allow_nan=False))
def test_other_schema_versions_are_refused_alone(version):
    doc = copy.deepcopy(BASE)
    doc["schema_version"] = version
    (err,) = validate_manifest(doc)
    assert err.pointer == "/schema_version" and "schema_version 2" in err.message
