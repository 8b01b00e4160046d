"""The goldens lock (harness.store.lock, lock_sync; issue 41 item 7): a golden edited
consistently by hand is refused by every reader of a locked root, naming the files."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path

import pytest
import yaml

from harness.cli import main
from harness.cli.validate import check_path
from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.store import GoldenStoreError, lint, new_provenance, read_golden, write_golden
from harness.store.lock import LOCK_FILE, read_lock
from harness.store.lock_sync import sync
from harness.surfaces.canonical import surface_file_bytes
from harness.surfaces.digest import sha256_hex
from suites.stored_goldens import copy_stored

PROV = new_provenance(commit="d892304", reason="initial capture", command="golden capture w",
                      environment={"device": "cpu"}, date="2026-12-07T08:00:00+00:00")
SMOKE = "qwen3_moe_tiny_smoke"
REPO = Path(__file__).resolve().parents[2]


def _workload_yaml(root: Path, workload: str) -> None:
    """A real workload spec (the smoke workload) renamed, so lint has nothing else to say."""
    spec = yaml.safe_load((REPO / "goldens" / SMOKE / "workload.yaml").read_text())
    spec["name"] = workload
    spec.setdefault("platform", {})["platforms"] = ["cpu"]
    (root / workload / "workload.yaml").write_text(yaml.safe_dump(spec))


def _write(root: Path, workload: str = "w", seed: int = 0) -> None:
    write_golden(root, workload, "cpu", synthetic_manifest(workload), synthetic_surfaces(workload, seed=seed), PROV)
    _workload_yaml(root, workload)


def _edit_consistently(golden: Path, surface: str = "training") -> None:
    """What a hostile contributor does: change a surface, fix the sha256 the manifest records."""
    path = golden / "surfaces" / f"{surface}.json"
    doc = json.loads(path.read_text())
    doc["sections"][min(doc["sections"])]["edited_by_hand"] = 1
    data = surface_file_bytes(doc)
    path.write_bytes(data)
    manifest = json.loads((golden / "manifest.json").read_text())
    for entry in manifest["surfaces"]:
        if entry["name"] == surface:
            entry["sha256"] = sha256_hex(data)
    (golden / "manifest.json").write_bytes(surface_file_bytes(manifest))


def test_writes_record_each_golden_and_reads_match(tmp_path):
    _write(tmp_path, "w")
    _write(tmp_path, "v")
    index = read_lock(tmp_path)
    assert sorted(index) == ["v/cpu", "w/cpu"]
    golden = read_golden(tmp_path, "w", "cpu")
    assert index["w/cpu"]["digest"] == golden.digest
    assert set(index["w/cpu"]["files"]) == set(golden.files)
    assert lint(tmp_path) == []


def test_a_consistent_hand_edit_is_refused_by_every_reader(tmp_path, capsys):
    _write(tmp_path)
    golden = tmp_path / "w" / "cpu"
    _edit_consistently(golden)
    with pytest.raises(GoldenStoreError) as refused:
        read_golden(tmp_path, "w", "cpu")
    message = str(refused.value)
    assert LOCK_FILE in message and "surfaces/training.json" in message and "manifest.json" in message
    assert [(f.kind, f.path) for f in lint(tmp_path)] == [("lock_mismatch", "w/cpu")]
    kind, errors = check_path(golden)
    assert kind == "golden directory" and len(errors) == 1 and "differs from its entry" in errors[0]
    assert main(["validate", str(golden)]) == 1
    capsys.readouterr()
    # the bug the lock guards: without it, the same edit reads as a sound golden
    (tmp_path / LOCK_FILE).unlink()
    assert read_golden(tmp_path, "w", "cpu").surfaces["training"]["sections"]
    assert check_path(golden)[1] == []
    assert [f.kind for f in lint(tmp_path)] == ["unlocked_root"]


def test_golden_check_refuses_an_edited_locked_golden_before_running(tmp_path, capsys):
    root = tmp_path / "goldens"
    copy_stored(SMOKE, root)
    shutil.copy(REPO / "goldens" / SMOKE / "workload.yaml", root / SMOKE / "workload.yaml")
    assert main(["lock", "--goldens-root", str(root)]) == 0
    _edit_consistently(next(p for p in (root / SMOKE).iterdir() if p.is_dir()))
    capsys.readouterr()
    assert main(["check", SMOKE, "--goldens-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "differs from its entry" in err and "surfaces/training.json" in err
    assert "Traceback" not in err


def test_a_golden_missing_from_the_lock_is_refused(tmp_path):
    _write(tmp_path, "w")
    _write(tmp_path / "elsewhere", "v")
    shutil.copytree(tmp_path / "elsewhere" / "v", tmp_path / "v")  # copied in beside the lock, not captured
    shutil.rmtree(tmp_path / "elsewhere")
    with pytest.raises(GoldenStoreError, match="not in .*GOLDENS.lock"):
        read_golden(tmp_path, "v", "cpu")
    assert ("lock_mismatch", "v/cpu") in {(f.kind, f.path) for f in lint(tmp_path)}


def test_lock_adds_unlocked_goldens_never_reblesses_and_drops_stale(tmp_path, capsys):
    _write(tmp_path, "w")
    _write(tmp_path, "v")
    (tmp_path / LOCK_FILE).unlink()
    assert main(["lock", "--goldens-root", str(tmp_path)]) == 0  # the first lock of a root
    assert sorted(read_lock(tmp_path)) == ["v/cpu", "w/cpu"]
    locked = read_lock(tmp_path)["w/cpu"]
    _edit_consistently(tmp_path / "w" / "cpu")
    assert main(["lock", "--goldens-root", str(tmp_path)]) == 1
    assert "refused w/cpu" in capsys.readouterr().out
    assert read_lock(tmp_path)["w/cpu"] == locked  # not re-blessed
    shutil.rmtree(tmp_path / "v" / "cpu")
    assert ("stale_lock_entry", f"{LOCK_FILE}#v/cpu") in {(f.kind, f.path) for f in lint(tmp_path)}
    result = sync(tmp_path)
    assert result.dropped == ["v/cpu"] and list(result.refused) == ["w/cpu"]
    assert sorted(read_lock(tmp_path)) == ["w/cpu"]


def test_a_refresh_rewrites_the_entry(tmp_path):
    _write(tmp_path, "w", seed=0)
    _edit_consistently(tmp_path / "w" / "cpu")
    _write(tmp_path, "w", seed=1)  # what golden refresh stores: the lock follows
    assert read_golden(tmp_path, "w", "cpu").digest == read_lock(tmp_path)["w/cpu"]["digest"]
    assert lint(tmp_path) == []


def test_the_first_write_into_an_unlocked_root_locks_its_other_goldens(tmp_path):
    _write(tmp_path, "w")
    _write(tmp_path, "broken")
    (tmp_path / LOCK_FILE).unlink()
    (tmp_path / "broken" / "cpu" / "manifest.json").write_text("{")  # damaged: not locked, still refused
    _write(tmp_path, "v")
    assert sorted(read_lock(tmp_path)) == ["v/cpu", "w/cpu"]
    with pytest.raises(GoldenStoreError):
        read_golden(tmp_path, "broken", "cpu")


@pytest.mark.parametrize("text, why", [
    ("{", "expected an object key"),
    ('{"format": 2, "goldens": {}}', "/format"),
    ('{"format": 1, "goldens": {"w": {}}}', "'<workload>/<platform>'"),
    ('{"format": 1, "goldens": {"w/cpu": {"digest": "' + "0" * 64 + '", "files": {"manifest.json": "'
     + "1" * 64 + '"}}}}', "does not match the file digests"),
])
def test_an_unreadable_lock_refuses_reads_and_writes(tmp_path, text, why):
    _write(tmp_path, "w")
    before = (tmp_path / "w" / "cpu" / "manifest.json").read_bytes()
    (tmp_path / LOCK_FILE).write_text(text)
    with pytest.raises(GoldenStoreError) as refused:
        read_golden(tmp_path, "w", "cpu")
    assert LOCK_FILE in str(refused.value) and why in str(refused.value)
    with pytest.raises(GoldenStoreError):
        _write(tmp_path, "w", seed=3)
    assert (tmp_path / "w" / "cpu" / "manifest.json").read_bytes() == before  # nothing stored
    assert (tmp_path / LOCK_FILE).read_text() == text  # not overwritten
    assert [f.kind for f in lint(tmp_path)] == ["bad_lock"]


def _writer(root: str, workload: str, rounds: int) -> None:
    for seed in range(rounds):
        write_golden(root, workload, "cpu", synthetic_manifest(workload), synthetic_surfaces(workload, seed=seed), PROV)


def test_concurrent_writers_of_different_goldens_both_land(tmp_path):
    _write(tmp_path, "seed")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), name, 4)) for name in ("a", "b", "c")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    index = read_lock(tmp_path)
    assert sorted(index) == ["a/cpu", "b/cpu", "c/cpu", "seed/cpu"]
    for name in ("a", "b", "c"):
        assert read_golden(tmp_path, name, "cpu").digest == index[f"{name}/cpu"]["digest"]


def test_a_write_killed_between_its_two_steps_leaves_both_states_accepted_never_a_hand_edit(tmp_path):
    from harness.store import lock
    from harness.store.atomic import _files_locked

    _write(tmp_path, "w", seed=0)
    golden = tmp_path / "w" / "cpu"
    old = _files_locked(golden)
    new = dict(old, **{"PROVENANCE.json": old["PROVENANCE.json"] + b" "})
    lock.stage(tmp_path, "w", "cpu", new, on_disk=old)  # the writer died here: before the swap
    assert read_golden(tmp_path, "w", "cpu").digest == read_lock(tmp_path)["w/cpu"]["digest"]
    _edit_consistently(golden)  # a hand edit, then a staged write that died: still refused
    lock.stage(tmp_path, "w", "cpu", new, on_disk=_files_locked(golden))
    with pytest.raises(GoldenStoreError, match="differs from its entry"):
        read_golden(tmp_path, "w", "cpu")
    _write(tmp_path, "w", seed=0)  # a complete write settles it
    assert "pending" not in read_lock(tmp_path)["w/cpu"] and lint(tmp_path) == []
