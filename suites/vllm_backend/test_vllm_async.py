"""The async vLLM engine (``AsyncLLM``, its own core and worker process) vs the native engine.

* greedy tokens are identical to the native engine's on the same weights, and
  the sampled-token logprobs agree to fp32 rounding (requests go in as
  concurrent ``generate`` streams, so vLLM batches them as it likes);
* a ZMQ refit into the vLLM worker process loads the policy's weights bit for
  bit, and greedy generation afterwards equals the native engine's on the
  same new weights (and differs from before);
* a broadcast refit (side group over gloo, the native bucket stream) does the
  same, into the same worker process: a second refit, version 2.

The engine is the one ``RolloutWorker`` builds for ``rollout.async: true``
(``VllmEngineProcesses``, no profiler), driven through its ``EngineProcesses``
surface (``call``, ``call_each``) exactly as the actor drives it.
"""

from __future__ import annotations

import os
import threading

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: the optional tier ci/l3_vllm.sh runs these tests")

import torch

from harness.parallel.rendezvous import RendezvousServer
from harness.refit.broadcast import SideGroupSlot, broadcast_weights
from harness.refit.zmq_stream import ipc_address, send_weights_zmq
from harness.rollout.engine_worker import (
    configure_determinism,
    initial_weights,
    resolve_eos_token_id,
)
from harness.rollout.native.engine import Engine
from suites.vllm_backend.conftest import vllm_spec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = [[1, 2, 3, 4, 5], [10, 20, 30], [7] * 9, [200, 13], [42] * 20, [5, 6]]


def _requests(temperature=0.0, max_new_tokens=16):
    return [{"request_id": f"r{i}", "prompt_ids": p, "max_new_tokens": max_new_tokens, "seed": i,
             "temperature": temperature, "top_p": 1.0} for i, p in enumerate(PROMPTS)]


def _native(spec, weights):
    return Engine(spec["model"], weights, eos_token_id=resolve_eos_token_id(spec), max_batch_size=8)


@pytest.fixture(scope="module")
def spec():
    return vllm_spec(**{"async": True})


@pytest.fixture(scope="module")
def procs(spec, tmp_path_factory):
    from harness.rollout.vllm.engine import VllmEngineProcesses

    configure_determinism()
    engine = VllmEngineProcesses.start(spec, rank_prefix=0, label="vllm-async-test",
                                       work_dir=str(tmp_path_factory.mktemp("vllm-async")), profiler_class_path=None)
    yield engine
    engine.stop()


def _generate(procs, requests):
    (results,) = procs.call("generate", requests)  # one engine rank at TP1
    return results


def _assert_follows_native(spec, procs, weights, version):
    reqs = _requests()
    native = _native(spec, weights).generate(reqs)
    ours = _generate(procs, reqs)
    assert [r["request_id"] for r in ours] == [r["request_id"] for r in reqs]
    for n, v in zip(native, ours):
        assert v["output_ids"] == n["output_ids"], n["request_id"]
        assert v["finish_reason"] == n["finish_reason"]
        assert v["weight_version"] == version
        torch.testing.assert_close(torch.tensor(v["logprobs"]), torch.tensor(n["logprobs"]), rtol=0, atol=1e-5)
    return ours


def test_async_engine_runs_in_its_own_process(procs):
    assert procs.profiled is False
    assert len(procs.pids) == 1 and procs.pids[0] != os.getpid()
    assert procs.call("weight_version") == [0]
    (info,) = procs.call("state_dict_info")
    assert info == _native(vllm_spec(), initial_weights(vllm_spec())).state_dict_info()


def test_async_greedy_tokens_and_logprobs_equal_native_engine(spec, procs):
    _assert_follows_native(spec, procs, initial_weights(spec), version=0)


def test_async_sampling_is_a_function_of_the_request_seed(procs):
    reqs = _requests(temperature=1.0, max_new_tokens=10)
    first = _generate(procs, reqs)
    again = _generate(procs, list(reversed(reqs)))[::-1]
    assert [r["output_ids"] for r in first] == [r["output_ids"] for r in again]


def _assert_holds(procs, weights):
    (held,) = procs.call("state_dict")  # tensors, decoded from the worker's bytes
    assert set(held) == set(weights)
    bad = [n for n in weights if not torch.equal(held[n], weights[n])]
    assert not bad, bad[:5]


def test_async_zmq_refit_then_generation_follows_native(spec, procs, tmp_path):
    before = _generate(procs, _requests())
    policy = initial_weights(dict(spec, seed=int(spec["seed"]) + 1))  # "trained" weights: another init
    address = ipc_address(str(tmp_path), "e0-tp0")
    sender = threading.Thread(target=send_weights_zmq, kwargs={
        "named_tensors": list(policy.items()), "address": address, "buffer_size_bytes": 65536})
    sender.start()
    versions = procs.call_each("receive_weights_zmq", [{"address": address, "timeout_ms": 60_000}])
    sender.join(60)
    assert versions == [1] == procs.call("weight_version")
    _assert_holds(procs, policy)
    after = _assert_follows_native(spec, procs, policy, version=1)
    assert [r["output_ids"] for r in after] != [r["output_ids"] for r in before]


def test_async_broadcast_refits_reuse_one_side_group_then_generation_follows_native(spec, procs):
    version0 = procs.call("weight_version")[0]
    before = _generate(procs, _requests())
    store, sender = RendezvousServer(), SideGroupSlot()  # the refit driver's role: the store is served here
    side = {"host": store.host, "port": store.port, "world_size": 2, "prefix": "vllm-async-test"}
    try:
        for refit in range(3):
            policy = initial_weights(dict(spec, seed=int(spec["seed"]) + 2 + refit))
            out: dict = {}

            def receive(out=out):
                try:
                    out["versions"] = procs.call_each("receive_weights_broadcast",
                                                      [{**side, "rank": 1, "buffer_size_bytes": 65536}])
                except BaseException as exc:  # noqa: BLE001 - re-raised by the assertion below
                    out["error"] = exc

            receiver = threading.Thread(target=receive)
            receiver.start()
            try:
                buckets = broadcast_weights(policy.items(), sender.join(rank=0, **side), buffer_size_bytes=65536)
            finally:
                receiver.join(120)
            assert "error" not in out, out.get("error")
            assert buckets > 1
            assert not torch.distributed.is_initialized()
            assert out["versions"] == [version0 + 1 + refit] == procs.call("weight_version")
            _assert_holds(procs, policy)
            held = procs.call("side_groups")  # per worker: one group, built by the first refit
            assert [[(g["port"], g["rank"], g["created"]) for g in rank] for rank in held] == [[(store.port, 1, 1)]]
        after = _assert_follows_native(spec, procs, policy, version=version0 + 3)
        assert [r["output_ids"] for r in after] != [r["output_ids"] for r in before]
        procs.call("close_side_groups")
        assert procs.call("side_groups") == [[]]
    finally:
        sender.close()
        store.close()
