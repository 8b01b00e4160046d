"""Postflight on synthetic run directories (no torch, no ray).

A run directory is assembled with the real trace writer and the real spec
loader/planner, so the test exercises the same seams a workload run does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.artifacts import layout
from harness.artifacts.trace import TraceWriter
from harness.manifest.validate import load_manifest
from harness.postflight.run import lifecycle_problems, postflight
from harness.spec.load import load_spec, spec_digest
from harness.spec.topology import plan


def _write_run(run_dir: Path, *, steps: int = 2, break_rank: int | None = None, status: str = "completed") -> dict:
    spec = load_spec("qwen3_moe_tiny_smoke", (f"grpo.iterations={steps}",))
    topo = plan(spec)
    expected = [layout.policy_trace_path(0), layout.rollout_trace_path(0), layout.METRICS, layout.ROLLOUTS]
    run = {
        "run_id": "synthetic-0001", "workload": spec["name"], "spec": spec, "spec_digest": spec_digest(spec),
        "topology": topo.to_dict(), "git_commit": None, "status": status, "error": None,
        "environment": {"python": "3.11", "torch": None, "ray": None, "backends": {"policy": "native"},
                        "platform": "linux", "device": "cpu", "harness_version": "0"},
        "expected_artifacts": expected,
    }
    (run_dir / layout.RUN_JSON).write_text(json.dumps(run))
    for role in ("policy", "rollout"):
        path = run_dir / layout.trace_path(role, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        w = TraceWriter(path, {"role": role, "rank": 0, "run_id": "synthetic-0001", "pid": 1,
                               "profiler": "x.Y", "harness_version": "0"})
        for step in range(1, steps + 1):
            phase = f"train/step{step}" if role == "policy" else f"rollout/step{step}/attempt1"
            begin, finish = ("begin_train_step", "finish_train_step") if role == "policy" else (
                "begin_rollout", "finish_rollout")
            w.write({"type": "event", "event": begin, "phase": phase})
            if break_rank is not None and step == steps and role == "policy":
                continue  # the step never closes
            w.write({"type": "phase", "phase": phase, "outcome": "finished",
                     "operators": {"aten::mm": 4 * step}, "collectives": [["all_reduce", "tp", "float32", 8]],
                     "memory": {"rss": 1000}, "wall_s": 0.5})
            w.write({"type": "event", "event": finish, "phase": phase})
        if break_rank is None:
            w.write({"type": "close"})
        w.close()
    with open(run_dir / layout.METRICS, "w") as fh:
        for step in range(1, steps + 1):
            fh.write(
                json.dumps({"step": step, "metrics": {"loss": 0.5 / step}, "timings": {"total_step_time": 1.0}}) + "\n"
            )
    with open(run_dir / layout.ROLLOUTS, "w") as fh:
        fh.write(json.dumps({"rollout_id": "step0001-attempt1-row0000", "calls": [], "decision": "trained"}) + "\n")
    return run


def test_complete_run_gets_a_valid_manifest_and_six_surfaces(tmp_path):
    _write_run(tmp_path)
    result = postflight(tmp_path)
    assert result.status == "complete", result.failed_checks
    manifest = load_manifest(tmp_path / layout.MANIFEST)  # schema v2 + hashes + files
    assert manifest["status"] == "complete"
    names = {s["name"] for s in manifest["surfaces"]}
    assert {"topology", "lifecycle", "operators", "collectives", "rollouts", "training"} <= names
    coll = result.surfaces["collectives"]["sections"]["policy/rank00000"]
    assert coll["phases"]["train/step2"]["collectives"] == [["all_reduce", "tp", "float32", 8]]
    assert coll["coords"]["tp"] == 0
    assert result.surfaces["training"]["sections"]["step0002"]["metrics"]["loss"] == 0.25


def test_postflight_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _write_run(a)
    _write_run(b)
    postflight(a), postflight(b)
    for name in ("topology", "lifecycle", "operators", "collectives", "rollouts", "training"):
        assert (a / "surfaces" / f"{name}.json").read_bytes() == (b / "surfaces" / f"{name}.json").read_bytes()


def test_unclosed_step_and_missing_close_make_the_run_incomplete(tmp_path):
    _write_run(tmp_path, break_rank=0)
    result = postflight(tmp_path)
    assert result.status == "incomplete"
    failed = {c["name"]: c["detail"] for c in result.failed_checks}
    assert "policy/rank00000: begin_train_step (train/step2) never finished or aborted" in failed["lifecycle_balanced"]
    assert "policy/rank00000" in failed["traces_closed"]
    assert load_manifest(tmp_path / layout.MANIFEST)["status"] == "incomplete"


def test_missing_and_torn_artifacts_are_named(tmp_path):
    _write_run(tmp_path)
    (tmp_path / layout.rollout_trace_path(0)).unlink()
    with open(tmp_path / layout.policy_trace_path(0), "ab") as fh:
        fh.write(b'{"seq": 99, "type": "ev')  # a torn last record
    result = postflight(tmp_path)
    failed = {c["name"]: c["detail"] for c in result.failed_checks}
    assert "artifacts/rollout/rank00000.trace.jsonl" in failed["artifacts_present"]
    assert "torn record" in failed["traces_intact"]
    assert result.status == "incomplete"


def test_failed_run_is_marked_failed(tmp_path):
    _write_run(tmp_path, status="failed")
    assert postflight(tmp_path).status == "failed"


def test_failed_run_detail_in_the_manifest_has_no_colour_codes_or_machine_paths(tmp_path):
    run = _write_run(tmp_path, status="failed")
    run["error"] = ("RuntimeError: policy worker 1 (rank 1) died during train: "
                    "\x1b[31mworker process exited\x1b[0m; "
                    "its log: see /tmp/ray/session_2026/logs/worker-ab-01-4242.err; "
                    f"trace {tmp_path}/artifacts/x.jsonl;"
                    " gloo [../third_party/gloo/pair.cc:534] Connection closed by peer [127.0.0.1]:5555")
    (tmp_path / layout.RUN_JSON).write_text(json.dumps(run))
    postflight(tmp_path)
    manifest = json.loads((tmp_path / layout.MANIFEST).read_text())
    (check,) = [c for c in manifest["checks"] if c["name"] == "run_completed"]
    detail = check["detail"]
    assert "\x1b" not in detail and "/tmp/" not in detail and str(tmp_path) not in detail, detail
    assert "worker process exited; its log: see …/worker-ab-01-4242.err; trace artifacts/x.jsonl" in detail
    assert "[../third_party/gloo/pair.cc:534] Connection closed by peer [127.0.0.1]:5555" in detail


@pytest.mark.parametrize(
    "events,problem",
    [
        ([("finish_train_step", "train/step1")], "without a matching begin"),
        ([("begin_train_step", "train/step1"), ("begin_train_step", "train/step2")], "still open"),
        ([("begin_rollout", "r1"), ("finish_train_step", "r1")], "without a matching begin"),
    ],
)
def test_lifecycle_problems(events, problem):
    class Trace:
        def of_type(self, t):
            return [{"event": e, "phase": p} for e, p in events]

    assert any(problem in p for p in lifecycle_problems("policy/rank00000", Trace()))
