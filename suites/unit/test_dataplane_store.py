"""StagingDB: durability, digests, idempotence, snapshots, tensors."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
import torch

from harness.dataplane.staging_db import DigestMismatch, StagingConflict, StagingDB

ROW = {"token_ids_delta": [1, 2, 3], "token_mask_delta": [0, 1, 1], "generation_log_probs_delta": [0.0, -0.5, -0.25]}


@pytest.fixture
def store(tmp_path):
    s = StagingDB(tmp_path / "dp.sqlite")
    yield s
    s.close()


def test_stage_fetch_roundtrip_and_pragmas(store):
    digest = store.stage("r0/c0", ROW)
    assert len(digest) == 64 and store.digest("r0/c0") == digest
    assert store.fetch("r0/c0") == ROW
    mode = store._db.execute("PRAGMA journal_mode").fetchone()[0]
    sync = store._db.execute("PRAGMA synchronous").fetchone()[0]
    assert (mode, sync) == ("wal", 2)  # 2 = FULL


def test_restage_identical_is_idempotent_and_conflict_is_refused(store):
    d = store.stage("r0/c0", ROW)
    assert store.stage("r0/c0", dict(reversed(list(ROW.items())))) == d  # canonical: key order irrelevant
    with pytest.raises(StagingConflict, match="'r0/c0'"):
        store.stage("r0/c0", {**ROW, "token_ids_delta": [1, 2, 4]})
    assert store.fetch("r0/c0") == ROW


def test_keys_by_literal_prefix(store):
    for k in ["r1/a", "r1/b", "r10/a", "r_/x"]:
        store.stage(k, {"v": k})
    assert store.keys("r1/") == ["r1/a", "r1/b"]
    assert store.keys("r_") == ["r_/x"]  # '_' is not a wildcard
    assert store.keys() == sorted(["r10/a", "r1/a", "r1/b", "r_/x"])


def test_missing_key_and_bad_rows_name_the_key(store):
    with pytest.raises(KeyError, match="'r9/c9'"):
        store.fetch("r9/c9")
    with pytest.raises(ValueError, match=r"'r0/c1'.*generation_log_probs_delta\[1\]"):
        store.stage("r0/c1", {"generation_log_probs_delta": [0.0, float("nan")]})
    with pytest.raises(ValueError, match="non-empty"):
        store.stage("", ROW)


def test_tampered_bytes_are_detected_on_fetch(store, tmp_path):
    store.stage("r0/c0", ROW)
    raw = sqlite3.connect(tmp_path / "dp.sqlite")
    raw.execute("UPDATE rows SET payload = replace(payload, '-0.5', '-0.4') WHERE key='r0/c0'")
    raw.commit()
    raw.close()
    with pytest.raises(DigestMismatch, match="'r0/c0'"):
        store.fetch("r0/c0")


def test_row_staged_then_sigkill_survives_reopen(tmp_path):
    path = tmp_path / "dp.sqlite"
    code = textwrap.dedent(f"""
        import os, signal, sys
        from harness.dataplane.staging_db import StagingDB
        s = StagingDB({str(path)!r})
        s.stage("r0/c0", {{"token_ids_delta": [7, 8, 9]}})
        sys.stdout.write("staged\\n"); sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "staged\n"
    with StagingDB(path) as reopened:
        assert reopened.fetch("r0/c0") == {"token_ids_delta": [7, 8, 9]}


def test_snapshot_and_restore(store, tmp_path):
    store.stage("r0/c0", ROW)
    store.put_tensors("step1/batch", {"x": torch.arange(4)})
    store.snapshot(tmp_path / "ckpt" / "dp.sqlite")
    store.stage("r0/c1", ROW)  # after the snapshot: must not come back
    restored = StagingDB.restore(tmp_path / "ckpt" / "dp.sqlite", tmp_path / "other.sqlite")
    assert restored.keys() == ["r0/c0"] and restored.fetch("r0/c0") == ROW
    assert torch.equal(restored.get_tensors("step1/batch")["x"], torch.arange(4))
    restored.close()
    with pytest.raises(FileNotFoundError, match="missing"):
        StagingDB.restore(tmp_path / "missing", tmp_path / "x.sqlite")


def test_tensors_roundtrip_bit_exact(store):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "input_ids": torch.randint(0, 100, (2, 5), generator=g),
        "advantages": torch.randn(2, 5, generator=g),
        "nan": torch.tensor([float("nan"), 1.0]),
        "mask": torch.tensor([True, False]),
        "half": torch.randn(3, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "strided": torch.arange(12).reshape(3, 4).t(),
    }
    store.put_tensors("step1/train", tensors)
    got = store.get_tensors("step1/train")
    assert set(got) == set(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert (
            got[name].reshape(-1).view(torch.uint8).tolist() == t.reshape(-1).contiguous().view(torch.uint8).tolist()
        ), name
    assert store.tensor_keys("step1/") == ["step1/train"]
    with pytest.raises(TypeError, match="'x'"):
        store.put_tensors("k", {"x": [1, 2]})
    assert store.delete_prefix("step1/") == 1 and store.tensor_keys() == []


def test_stage_many_isolates_bad_rows_and_commits_the_rest(store):
    store.stage("r0/old", ROW)
    items = [
        ("r1/c0", ROW),
        ("r1/c1", {"generation_log_probs_delta": [0.0, float("inf")]}),  # non-finite: refused
        ("", ROW),                                                       # bad key
        ("r0/old", {**ROW, "token_ids_delta": [9]}),                     # conflict with a staged row
        ("r1/c2", {"bad": object()}),                                    # not JSON-able
        ("r1/c3", {"v": 3}),
        ("r0/old", dict(ROW)),                                           # identical re-stage: idempotent
        ("r1/c3", {"v": 4}),                                             # conflict inside the batch
    ]
    out = store.stage_many(items)
    assert len(out) == len(items)
    assert out[0] == store.digest("r1/c0") and store.fetch("r1/c0") == ROW
    assert (
        isinstance(out[1], ValueError) and "'r1/c1'" in str(out[1]) and "generation_log_probs_delta[1]" in str(out[1])
    )
    assert isinstance(out[2], ValueError) and "non-empty" in str(out[2])
    assert isinstance(out[3], StagingConflict) and "'r0/old'" in str(out[3])
    assert isinstance(out[4], TypeError) and "'r1/c2'" in str(out[4])
    assert out[5] == store.digest("r1/c3") and out[6] == store.digest("r0/old")
    assert isinstance(out[7], StagingConflict) and "'r1/c3'" in str(out[7])
    assert store.keys() == ["r0/old", "r1/c0", "r1/c3"]  # nothing of the refused rows was stored
    assert store.fetch("r0/old") == ROW and store.fetch("r1/c3") == {"v": 3}
    assert store.stage_many([]) == []


def test_stage_many_digests_equal_single_stage(store, tmp_path):
    rows = [(f"r{i}/c0", {**ROW, "token_ids_delta": [i, i + 1, i + 2]}) for i in range(5)]
    with StagingDB(tmp_path / "single.sqlite") as single:
        assert store.stage_many(rows) == [single.stage(k, r) for k, r in rows]


def test_stage_many_failed_transaction_stages_nothing(store, tmp_path):
    other = sqlite3.connect(tmp_path / "dp.sqlite", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    store._db.execute("PRAGMA busy_timeout=50")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        store.stage_many([("r0/c0", ROW), ("r0/c1", ROW)])
    other.execute("ROLLBACK")
    other.close()
    assert store.keys() == []


def test_batch_staged_then_sigkill_survives_reopen(tmp_path):
    path = tmp_path / "dp.sqlite"
    code = textwrap.dedent(f"""
        import os, signal, sys
        from harness.dataplane.staging_db import StagingDB
        s = StagingDB({str(path)!r})
        out = s.stage_many([("r0/c%d" % i, {{"token_ids_delta": [i]}}) for i in range(4)])
        assert all(isinstance(d, str) for d in out), out
        sys.stdout.write("staged\\n"); sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "staged\n", proc.stderr
    with StagingDB(path) as reopened:
        assert reopened.fetch_many([f"r0/c{i}" for i in range(4)]) == [{"token_ids_delta": [i]} for i in range(4)]
