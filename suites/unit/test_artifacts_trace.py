"""Trace record format: round trip, torn last records, corruption, layout paths."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.artifacts.layout import (
    parse_trace_path,
    policy_trace_path,
    rollout_trace_path,
    section_name,
    trace_path,
)
from harness.artifacts.trace import TraceFormatError, TraceWriter, canonical_json, read_trace, record_crc

HEADER = {"role": "policy", "rank": 3, "run_id": "r1", "pid": 42, "profiler": "x.Y", "harness_version": "0.1.0"}


def _write_sample(path, n_events=3, close=True):
    writer = TraceWriter(path, HEADER)
    for i in range(n_events):
        writer.write({"type": "event", "event": "begin_train_step", "phase": f"train/step{i + 1}"})
    if close:
        writer.write({"type": "close"})
    writer.close()


def test_layout_paths():
    assert policy_trace_path(3) == "artifacts/policy/rank00003.trace.jsonl"
    assert rollout_trace_path(12) == "artifacts/rollout/rank00012.trace.jsonl"
    assert parse_trace_path("artifacts/rollout/rank00012.trace.jsonl") == ("rollout", 12)
    assert section_name("policy", 3) == "policy/rank00003"
    with pytest.raises(ValueError, match="role"):
        trace_path("critic", 0)
    with pytest.raises(ValueError, match="rank"):
        policy_trace_path(-1)
    with pytest.raises(ValueError, match="not a trace artifact"):
        parse_trace_path("artifacts/policy/rank3.json")


def test_round_trip_is_complete(tmp_path):
    path = tmp_path / policy_trace_path(3)
    _write_sample(path)
    trace = read_trace(path)
    assert trace.header["rank"] == 3 and trace.header["type"] == "header"
    assert [r["seq"] for r in trace.records] == [1, 2, 3, 4]
    assert trace.complete and not trace.torn and trace.problems == []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        assert record["crc"] == record_crc(record)
        assert line == canonical_json(record)


def test_unclosed_trace_is_not_complete_but_not_damaged(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_sample(path, close=False)
    trace = read_trace(path)
    assert not trace.closed and not trace.complete
    assert not trace.torn and trace.problems == []


@pytest.mark.parametrize(
    "damage",
    ["unterminated", "unparsable", "crc"],
)
def test_torn_last_record_is_detected(tmp_path, damage):
    path = tmp_path / "t.jsonl"
    _write_sample(path)
    data = path.read_bytes()
    lines = data.split(b"\n")[:-1]
    if damage == "unterminated":
        data = b"\n".join(lines[:-1]) + b"\n" + lines[-1][:-5]
    elif damage == "unparsable":
        data = b"\n".join(lines[:-1]) + b"\n" + b'{"seq": 4, "ty\n'
    else:
        data = b"\n".join(lines[:-1]) + b"\n" + lines[-1].replace(b'"close"', b'"event"') + b"\n"
    path.write_bytes(data)
    trace = read_trace(path)
    assert trace.torn
    assert not trace.complete
    assert len(trace.records) == 3  # the torn close record is dropped
    assert any(f"{path}:5: torn record" in p for p in trace.problems), trace.problems


def test_seq_gap_and_mid_file_damage_are_corruption_not_torn(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_sample(path, n_events=4)
    lines = path.read_text().splitlines(keepends=True)
    del lines[2]  # drop seq 2 -> gap
    lines[3] = "garbage\n"  # damage a middle line
    path.write_text("".join(lines))
    trace = read_trace(path)
    assert not trace.torn
    assert any("seq gap: expected 2, found 3" in p and f"{path}:3" in p for p in trace.problems), trace.problems
    assert any(f"{path}:4: corrupt record" in p for p in trace.problems), trace.problems
    assert not trace.complete


def test_missing_header_and_empty_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert read_trace(empty).problems == [f"{empty}:1: empty trace (no header)"]
    path = tmp_path / "t.jsonl"
    _write_sample(path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[1:]))
    trace = read_trace(path)
    assert trace.header is None
    assert any("not the header" in p for p in trace.problems)


def test_writer_refuses_bad_input(tmp_path):
    with pytest.raises(TraceFormatError, match="missing field.*run_id"):
        TraceWriter(tmp_path / "a.jsonl", {k: v for k, v in HEADER.items() if k != "run_id"})
    with pytest.raises(TraceFormatError, match="'role'"):
        TraceWriter(tmp_path / "b.jsonl", {**HEADER, "role": "critic"})
    writer = TraceWriter(tmp_path / "c.jsonl", HEADER)
    with pytest.raises(TraceFormatError, match="'type'"):
        writer.write({"type": "header"})
    with pytest.raises(TraceFormatError, match="seq"):
        writer.write({"type": "event", "seq": 9})
    with pytest.raises(TraceFormatError, match="not JSON-serialisable"):
        writer.write({"type": "event", "value": float("nan")})
    writer.write({"type": "close"})
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        writer.write({"type": "event"})
    with pytest.raises(FileExistsError, match="c.jsonl"):
        TraceWriter(tmp_path / "c.jsonl", HEADER)
    assert read_trace(tmp_path / "c.jsonl").complete


def test_killed_writer_leaves_whole_lines(tmp_path):
    """A process killed between writes leaves only whole, valid lines (no fsync needed)."""
    path = tmp_path / "killed.jsonl"
    code = f"""
import os
from harness.artifacts.trace import TraceWriter
w = TraceWriter({str(path)!r}, {HEADER!r})
for i in range(5):
    w.write({{"type": "event", "event": "begin_train_step", "phase": "train/step%d" % i}})
os._exit(9)
"""
    proc = subprocess.run([sys.executable, "-c", code], check=False)
    assert proc.returncode == 9
    trace = read_trace(path)
    assert len(trace.records) == 5 and not trace.torn and trace.problems == [] and not trace.closed


def test_gate_module_does_not_import_torch():
    code = ("import sys, harness.artifacts.trace, harness.artifacts.layout; "
            "print('torch' in sys.modules, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"
