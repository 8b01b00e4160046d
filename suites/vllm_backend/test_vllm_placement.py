"""Rollout profiler placement with the vLLM backend (docs/vllm.md, "Placement").

* sync TP=1: the profiler lives in the actor (trace header pid == actor pid);
* async engine: the substituted worker class builds the profiler inside
  vLLM's own worker process (trace pid != actor pid, == the engine pid the
  actor reports); the init window closes after warm-up and the rollout window
  is fanned out with ``collective_rpc``;
* gates before any engine exists: a custom ``rollout.worker_cls`` and, with a
  profiler, ``rollout.pp != 1`` / ``rollout.ep != 1`` are refused, and vLLM is
  not even imported (checked in a fresh interpreter).

The "actor" is a ``RolloutWorker`` built in this process (the Ray actor's
class without Ray), so its pid is this test's pid.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: the optional tier ci/l3_vllm.sh runs these tests")

from harness.artifacts.trace import read_trace
from suites.vllm_backend.conftest import vllm_spec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
PROFILER = "harness.profiler.trace.TraceRolloutProfiler"
REQUESTS = [{"request_id": f"r{i}", "prompt_ids": [3 + i, 4, 5], "max_new_tokens": 6, "seed": i,
             "temperature": 1.0, "top_p": 1.0} for i in range(4)]


def _run_worker(spec, run_dir, rank_prefix=0):
    from harness.rollout.worker import RolloutWorker

    env = {"NRL_ROLLOUT_PROFILER_CLASS": PROFILER, "HARNESS_TRACE_DIR": str(run_dir), "HARNESS_RUN_ID": "t"}
    worker = RolloutWorker(spec, 0, rank_prefix, str(run_dir), env_vars=env)
    try:
        info = worker.ready()
        asyncio.run(worker.begin_rollout("step1/attempt1"))
        results = asyncio.run(worker.generate(REQUESTS))
        asyncio.run(worker.finish_rollout())
    finally:
        worker.shutdown()
    return info, results


def _trace(run_dir, rank):
    trace = read_trace(os.path.join(run_dir, "artifacts", "rollout", f"rank{rank:05d}.trace.jsonl"))
    assert trace.complete, trace.problems
    phases = {r["phase"]: r for r in trace.records if r["type"] == "phase"}
    return trace.header, phases


def test_sync_tp1_profiler_lives_in_the_actor(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    info, results = _run_worker(vllm_spec(), tmp_path, rank_prefix=0)
    assert info["engine_pids"] == []  # vLLM runs in the actor process
    header, phases = _trace(tmp_path, 0)
    assert header["pid"] == os.getpid() == info["actor_pid"]
    assert list(phases) == ["engine_init", "rollout/step1/attempt1"]
    assert phases["rollout/step1/attempt1"]["operators"].get("_C::cpu_fused_moe", 0) > 0
    assert all(len(r["output_ids"]) == 6 for r in results)


def test_async_profiler_lives_in_vllm_worker_process(tmp_path):
    info, results = _run_worker(vllm_spec(**{"async": True}), tmp_path, rank_prefix=3)
    assert len(info["engine_pids"]) == 1
    header, phases = _trace(tmp_path, 3)  # rank_prefix + vLLM worker rank 0
    assert header["pid"] != os.getpid()
    assert header["pid"] == info["engine_pids"][0]
    assert header["rank"] == 3
    assert list(phases) == ["engine_init", "rollout/step1/attempt1"]
    assert all(p["outcome"] == "finished" for p in phases.values())
    # the model's kernels ran in that process, inside the fanned-out rollout window
    assert phases["rollout/step1/attempt1"]["operators"].get("_C::cpu_fused_moe", 0) > 0
    assert phases["engine_init"]["operators"].get("_C::cpu_fused_moe", 0) > 0  # warm-up inside the init window
    assert not os.path.exists(os.path.join(tmp_path, "artifacts", "rollout", "rank00000.trace.jsonl"))
    assert all(len(r["output_ids"]) == 6 for r in results)


GATE_SNIPPET = """
import json, sys
from suites.vllm_backend.conftest import vllm_spec
from harness.rollout.worker import RolloutWorker
spec = vllm_spec(**json.loads(sys.argv[1]))
env = {"NRL_ROLLOUT_PROFILER_CLASS": "harness.profiler.trace.TraceRolloutProfiler", "HARNESS_TRACE_DIR": sys.argv[2]}
try:
    RolloutWorker(spec, 0, 0, sys.argv[2], env_vars=env)
    error = None
except ValueError as exc:
    error = str(exc)
print(json.dumps({"error": error, "vllm_imported": any(m == "vllm" or m.startswith("vllm.") for m in sys.modules)}))
"""


@pytest.mark.parametrize("rollout,message", [
    ({"worker_cls": "vllm.v1.worker.cpu_worker.CPUWorker"}, "rollout.worker_cls 'vllm.v1.worker.cpu_worker.CPUWorker'"),
    ({"worker_cls": "my_pkg.MyWorker", "async": True}, "rollout.worker_cls 'my_pkg.MyWorker'"),
    ({"pp": 2}, "rollout.pp must be 1"),
    ({"ep": 2}, "rollout.ep must be 1"),
])
def test_refused_before_engine_creation(tmp_path, rollout, message):
    out = subprocess.run([sys.executable, "-c", GATE_SNIPPET, json.dumps(rollout), str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=True, env=dict(os.environ))
    verdict = json.loads(out.stdout.strip().splitlines()[-1])
    assert verdict["error"] is not None and message in verdict["error"]
    assert verdict["vllm_imported"] is False
    assert not os.path.exists(os.path.join(tmp_path, "vllm"))  # no model dir was written


def test_resolve_worker_cls_substitutes_profiling_worker_only_when_needed():
    from harness.rollout.vllm.engine import resolve_worker_cls

    ours = "harness.rollout.vllm.profiling_worker.RolloutProfilingCPUWorker"
    assert resolve_worker_cls(vllm_spec(), PROFILER) is None  # sync TP1: the actor hosts the profiler
    assert resolve_worker_cls(vllm_spec(**{"async": True}), PROFILER) == ours
    assert resolve_worker_cls(vllm_spec(tp=2), PROFILER) == ours
    assert resolve_worker_cls(vllm_spec(**{"async": True}), None) is None
    with pytest.raises(ValueError, match="rollout.worker_cls"):
        resolve_worker_cls(vllm_spec(worker_cls="harness.rollout.engine_worker.EngineWorker"), PROFILER)
