"""A golden never holds an absolute path: the store refuses one, lint finds an old one.

Real store writes under tmp_path; the detector is checked on hand-made cases and
as a property over generated documents.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.store import GoldenStoreError, lint, new_provenance, read_golden, write_golden
from harness.surfaces.canonical import json_pointer, surface_file_bytes
from harness.surfaces.digest import sha256_hex
from harness.surfaces.portability import absolute_paths

# What a leak looks like: paths into this checkout (absolute, and different on every machine).
REPO = Path(__file__).resolve().parents[2]
LEAKED = str(REPO / "runs" / "x.json")
LEAKED_OP = f"{REPO}/ext/fused.so::op"
LEAKED_OP_PTR = json_pointer((LEAKED_OP,))

PROV = new_provenance(commit="d892304", reason="initial capture", command="golden capture w",
                      environment={"device": "cpu"}, date="2026-11-29T08:00:00+00:00")


def _doc(sections):
    return {"surface": "rollouts", "version": 1, "workload": "w", "sections": sections}


@pytest.mark.parametrize("template", ["{d}", "cache at {d}/y.bin", "path={d}", "('{d}',)", "[{d}/]"])
def test_paths_are_found(template):
    text = template.format(d=REPO / "runs")
    assert absolute_paths(_doc({"s": {"note": text}})) == [("/sections/s/note", text)]


@pytest.mark.parametrize("text", [
    "train/loss", "policy/rank00003", "aten::add_", "file://host/x/y", "ratio 1/2/3", "/tmp", "nccl:all_reduce",
    "train/step1/attempt2",
])
def test_names_with_slashes_are_not_paths(text):
    assert absolute_paths(_doc({"s": {"note": text}})) == []


def test_keys_are_checked_and_volatile_keys_are_not():
    key = f"{REPO}/lib.so::fused"
    doc = {"surface": "operators", "version": 1, "workload": "w",
           "sections": {"policy/rank00000": {"phases": {"p": {"operators": {key: 3}}},
                                             "run_dir": str(REPO / "runs" / "r1")}}}
    assert absolute_paths(doc) == [(json_pointer(("sections", "policy/rank00000", "phases", "p", "operators", key)),
                                    key)]


_names = st.text(alphabet="abcz_:.-019", min_size=1, max_size=6)
_tree = st.recursive(
    st.one_of(st.integers(), st.booleans(), st.none(), _names.map(lambda s: s + "/x")),
    lambda kids: st.one_of(st.lists(kids, min_size=1, max_size=3),
                           st.dictionaries(_names, kids, min_size=1, max_size=3)),
    max_leaves=12,
)


def _leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, path + (i,))
    else:
        yield path


@settings(max_examples=150, deadline=None)
@given(tree=st.dictionaries(_names, _tree, min_size=1, max_size=3), data=st.data())
def test_a_planted_path_is_found_exactly_where_it_was_planted(tree, data):
    doc = _doc({"s": tree})
    assert absolute_paths(doc) == []  # names with a slash inside are never paths
    leaves = list(_leaves(tree))
    where = data.draw(st.sampled_from(leaves))
    planted = copy.deepcopy(tree)
    node = planted
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = LEAKED  # the tree is a non-empty dict: every leaf has a path
    assert absolute_paths(_doc({"s": planted})) == [(json_pointer(("sections", "s") + where), LEAKED)]


def _with_path(docs):
    bad = copy.deepcopy(docs)
    section = next(iter(bad["operators"]["sections"].values()))
    phase = next(iter(section["phases"].values()))
    phase["operators"][LEAKED_OP] = 1
    return bad


def test_the_store_refuses_a_surface_with_a_path_and_writes_nothing(tmp_path):
    bad = _with_path(synthetic_surfaces("w"))
    with pytest.raises(GoldenStoreError, match=rf"surface operators: /sections/.*/operators{re.escape(LEAKED_OP_PTR)}: "
                                               r".* holds an absolute path"):
        write_golden(tmp_path, "w", "cpu", synthetic_manifest("w"), bad, PROV)
    assert not (tmp_path / "w").exists() or os.listdir(tmp_path / "w") == []


def test_lint_names_an_old_golden_that_holds_a_path(tmp_path):
    docs = synthetic_surfaces("w")
    write_golden(tmp_path, "w", "cpu", synthetic_manifest("w"), docs, PROV)
    (tmp_path / "w" / "workload.yaml").write_text("name: w\nplatform: {platforms: [cpu]}\n")
    assert [f for f in lint(tmp_path) if f.kind == "machine_specific"] == []
    # What a writer from before this check could have stored: a consistent golden
    # (sha256 in the manifest matches) whose operators surface holds a path.
    golden = tmp_path / "w" / "cpu"
    data = surface_file_bytes(_with_path(docs)["operators"])
    (golden / "surfaces" / "operators.json").write_bytes(data)
    manifest = json.loads((golden / "manifest.json").read_text())
    for entry in manifest["surfaces"]:
        if entry["name"] == "operators":
            entry["sha256"] = sha256_hex(data)
    (golden / "manifest.json").write_bytes(surface_file_bytes(manifest))
    (tmp_path / "GOLDENS.lock").unlink()  # such a golden predates the goldens lock too
    read_golden(tmp_path, "w", "cpu")  # consistent, so the store reads it
    found = [f for f in lint(tmp_path) if f.kind == "machine_specific"]
    assert [f.path for f in found] == ["w/cpu/surfaces/operators.json"]
    assert LEAKED_OP_PTR in found[0].message
