"""``RolloutWorker.generate_one`` dispatch: failures reach every waiting request,
and cancelling the dispatcher cancels the requests instead of being swallowed.

A real in-actor worker (native engine, no Ray); ``_generate_batch`` is replaced
on the instance so a batch can fail or hang on demand, which the real engine
cannot be made to do.
"""

from __future__ import annotations

import asyncio

import pytest

from harness.rollout.worker import RolloutWorker
from harness.spec.typed import as_workload

MODEL = dict(layers=1, hidden=16, heads=2, kv_heads=1, head_dim=8, experts=2, top_k=1,
             moe_intermediate=8, vocab=32, max_position=32)
SPEC = as_workload({"seed": 1, "model": MODEL, "platform": {"device": "cpu"},
                    "rollout": {"backend": "native", "tp": 1, "pp": 1, "ep": 1, "async": False, "max_batch_size": 2,
                                "worker_cls": None}})


@pytest.fixture
def worker(tmp_path, monkeypatch):
    monkeypatch.setenv("NRL_ROLLOUT_PROFILER_CLASS", "")
    monkeypatch.setenv("RANK", "0")
    w = RolloutWorker(SPEC, 0, 0, str(tmp_path))
    yield w
    w.shutdown()


def test_a_failed_batch_fails_each_of_its_requests_and_the_next_batch_runs(worker):
    calls: list[list[int]] = []

    async def generate_batch(requests):
        calls.append([r["i"] for r in requests])
        if len(calls) == 1:
            raise RuntimeError("engine fell over")
        return [{"i": r["i"]} for r in requests]

    worker._generate_batch = generate_batch

    async def main():
        first = [asyncio.ensure_future(worker.generate_one({"i": i})) for i in range(3)]
        failed = await asyncio.gather(*first, return_exceptions=True)
        later = await worker.generate_one({"i": 9})
        return failed, later

    failed, later = asyncio.run(main())
    assert [type(e) for e in failed] == [RuntimeError] * 3 and all("fell over" in str(e) for e in failed)
    assert later == {"i": 9} and calls == [[0, 1, 2], [9]]


def test_cancelling_the_dispatcher_cancels_waiting_requests(worker):
    started = asyncio.Event

    async def main():
        gate = started()

        async def generate_batch(requests):
            gate.set()
            await asyncio.sleep(3600)

        worker._generate_batch = generate_batch
        running = asyncio.ensure_future(worker.generate_one({"i": 0}))
        await gate.wait()
        queued = asyncio.ensure_future(worker.generate_one({"i": 1}))  # pending behind the hung batch
        await asyncio.sleep(0)
        worker._dispatcher.cancel()
        # Bounded: a dispatcher that swallowed the cancellation would run the queued
        # request into the hung engine and never finish.
        results = await asyncio.wait_for(asyncio.gather(running, queued, return_exceptions=True), 30)
        return results, worker._dispatcher

    results, dispatcher = asyncio.run(main())
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    assert dispatcher.cancelled()  # the cancellation was not swallowed
