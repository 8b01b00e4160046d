"""Concurrent refreshes (issue 16): the second writer finds the golden changed under it and fails.

The two refreshes are interleaved deterministically in one process (both compare against the
old golden, then both store), which is the interleaving two `golden refresh` processes hit;
the runs are real run directories as postflight leaves them, the store is the real one.
"""

from __future__ import annotations

import json

import pytest

from harness import flows
from harness.parity.synthetic import synthetic_surfaces
from harness.postflight.read import RunUnusable
from harness.postflight.run import PostflightResult
from harness.spec.typed import as_workload
from harness.store import new_provenance, read_golden, write_golden
from harness.store.atomic import GoldenChanged, golden_digest
from suites.run_dirs import make_run, read_manifest, write_manifest

SPEC = {"name": "w", "platform": {"platforms": ["cpu"], "device": "cpu"},
        "policy": {"backend": "native"}, "rollout": {"backend": "native"}}


def execution(run_dir, docs) -> flows.Execution:
    return flows.Execution(as_workload(SPEC), run_dir, PostflightResult(run_dir, "complete", [], docs), 1.0)


@pytest.fixture
def store(tmp_path):
    old = synthetic_surfaces("w", seed=5)
    run = make_run(tmp_path / "old", old)
    root = tmp_path / "goldens"
    write_golden(root, "w", "cpu", read_manifest(run), old,
                 new_provenance(commit=None, reason="first", command="pytest", environment={}))
    return tmp_path, root


def test_the_second_of_two_concurrent_refreshes_fails_and_stores_nothing(store):
    tmp_path, root = store
    docs_a, docs_b = synthetic_surfaces("w", seed=6), synthetic_surfaces("w", seed=7)
    a = execution(make_run(tmp_path / "a", docs_a), docs_a)
    b = execution(make_run(tmp_path / "b", docs_b), docs_b)
    assert not flows.compare_with_golden(a, "cpu", root).ok  # both compare against the old golden
    assert not flows.compare_with_golden(b, "cpu", root).ok
    flows.store_golden(a, "cpu", reason="a", goldens_root=root, command="golden refresh w", allow_replace=True)
    stored_a = golden_digest(root, "w", "cpu")
    with pytest.raises(GoldenChanged, match=r"changed while this command ran .* nothing stored"):
        flows.store_golden(b, "cpu", reason="b", goldens_root=root, command="golden refresh w", allow_replace=True)
    assert golden_digest(root, "w", "cpu") == stored_a  # main: b silently overwrote a
    assert read_golden(root, "w", "cpu").provenance["reason"] == "a"


def test_a_refresh_that_compared_against_the_current_golden_stores(store):
    tmp_path, root = store
    docs = synthetic_surfaces("w", seed=6)
    a = execution(make_run(tmp_path / "a", docs), docs)
    flows.compare_with_golden(a, "cpu", root)
    flows.store_golden(a, "cpu", reason="a", goldens_root=root, command="golden refresh w", allow_replace=True)
    assert read_golden(root, "w", "cpu").provenance["reason"] == "a"


def test_a_capture_under_the_lock_refuses_a_golden_that_appeared(store):
    tmp_path, root = store
    docs = synthetic_surfaces("w", seed=6)
    run = make_run(tmp_path / "a", docs)
    with pytest.raises(GoldenChanged, match="compared against no golden"):
        write_golden(root, "w", "cpu", read_manifest(run), docs,
                     new_provenance(commit=None, reason="c", command="pytest", environment={}), expect=None)


def test_compare_with_golden_validates_the_run_manifest_first(store):
    """The pytest plugin and refresh compare through flows.compare_with_golden."""
    tmp_path, root = store
    docs = synthetic_surfaces("w", seed=5)
    run = make_run(tmp_path / "a", docs)
    manifest = read_manifest(run)
    manifest["surfaces"][0]["path"] = "/etc/hostname"
    write_manifest(run, manifest)
    with pytest.raises(RunUnusable, match=r"#/surfaces/0/path: path '/etc/hostname' is absolute"):
        flows.compare_with_golden(execution(run, docs), "cpu", root)
    assert json.loads((run / "manifest.json").read_text())["surfaces"][0]["path"] == "/etc/hostname"


def test_a_refresh_without_comparison_fails_when_the_golden_changed_during_its_run(store):
    """`pytest --golden-refresh` does not compare first: it records the golden's digest
    before the workload runs (remember_golden) and stores only over that one."""
    tmp_path, root = store
    docs_a, docs_b = synthetic_surfaces("w", seed=6), synthetic_surfaces("w", seed=7)
    b = execution(make_run(tmp_path / "b", docs_b), docs_b)
    flows.remember_golden(b, golden_digest(root, "w", "cpu"))  # read before b's workload ran
    a = execution(make_run(tmp_path / "a", docs_a), docs_a)   # a refresh that landed meanwhile
    flows.store_golden(a, "cpu", reason="a", goldens_root=root, command="golden refresh w", allow_replace=True)
    with pytest.raises(GoldenChanged, match="nothing stored"):
        flows.store_golden(b, "cpu", reason="b", goldens_root=root, command="pytest --golden-refresh",
                           allow_replace=True)
    assert read_golden(root, "w", "cpu").provenance["reason"] == "a"


def test_a_refresh_without_comparison_stores_over_the_golden_it_remembered(store):
    tmp_path, root = store
    docs = synthetic_surfaces("w", seed=6)
    b = execution(make_run(tmp_path / "b", docs), docs)
    flows.remember_golden(b, golden_digest(root, "w", "cpu"))
    flows.store_golden(b, "cpu", reason="b", goldens_root=root, command="pytest --golden-refresh", allow_replace=True)
    assert read_golden(root, "w", "cpu").provenance["reason"] == "b"


def test_a_refresh_reads_the_old_tolerances_bounded(store):
    """The declared bands are carried over, but an oversized tolerances.yaml is refused
    from its size (never read whole) and nothing is stored."""
    from harness.spec.errors import SpecError
    from harness.spec.yaml_io import MAX_YAML_BYTES

    tmp_path, root = store
    (root / "w" / "cpu" / "tolerances.yaml").write_bytes(b"#" * (MAX_YAML_BYTES + 1))
    docs = synthetic_surfaces("w", seed=6)
    b = execution(make_run(tmp_path / "b", docs), docs)
    with pytest.raises(SpecError, match="byte limit"):
        flows.store_golden(b, "cpu", reason="b", goldens_root=root, command="pytest --golden-refresh",
                           allow_replace=True)
    assert json.loads((root / "w" / "cpu" / "PROVENANCE.json").read_text())["reason"] == "first"
