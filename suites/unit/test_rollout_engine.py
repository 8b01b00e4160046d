"""The native engine on one process: math, determinism, batch invariance, stopping."""

from __future__ import annotations

import pytest
import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.rollout.engine import Engine
from harness.rollout.sampling import sample_token
from harness.rollout.sharding import ShardPlan, hf_weight_shapes

CFG = ModelConfig(layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, experts=4, top_k=2,
                  moe_intermediate=16, vocab=64, max_position=96)


@pytest.fixture(scope="module")
def reference():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    return build_reference_model(CFG, seed=11)


@pytest.fixture(scope="module")
def weights(reference):
    return {n: t.detach() for n, t in reference.state_dict().items()}


def _requests(n=6, max_new=7, temperature=1.0, top_p=1.0):
    return [
        dict(request_id=f"r{i}", prompt_ids=[(3 * i + j) % 64 for j in range(2 + i)], max_new_tokens=max_new + i % 3,
             seed=100 + i, temperature=temperature, top_p=top_p if i % 2 else 1.0)
        for i in range(n)
    ]


def test_weight_names_match_the_reference_model(weights):
    assert list(hf_weight_shapes(CFG)) == list(weights)
    assert all(tuple(weights[n].shape) == s for n, s in hf_weight_shapes(CFG).items())


def test_prompt_logprobs_equal_reference_model(reference, weights):
    engine = Engine(CFG, weights, max_batch_size=2)
    ids = [5, 9, 1, 33, 7, 60, 2, 2, 41]
    got = engine.prompt_logprobs(ids)
    want = reference.logprobs(torch.tensor([ids]))[0]
    assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_decode_logprobs_equal_full_recompute(reference, weights):
    """KV-cache decode agrees with a full forward of prompt + output (T = 1, top_p = 1)."""
    (result,) = Engine(CFG, weights, max_batch_size=1).generate(_requests(1, max_new=10))
    full = result["prompt_ids"] + result["output_ids"]
    want = reference.logprobs(torch.tensor([full]))[0, len(result["prompt_ids"]):]
    assert torch.allclose(torch.tensor(result["logprobs"]), want, atol=1e-5, rtol=0)


def test_same_seed_twice_is_bit_identical(weights):
    a = Engine(CFG, weights, max_batch_size=4).generate(_requests(top_p=0.8))
    b = Engine(CFG, weights, max_batch_size=4).generate(_requests(top_p=0.8))
    assert a == b


def test_batch_size_and_composition_change_no_request(weights):
    requests = _requests(top_p=0.9)
    baseline = {r["request_id"]: r for r in Engine(CFG, weights, max_batch_size=8).generate(requests)}
    for size in (1, 3):
        shuffled = requests[::-1]
        got = Engine(CFG, weights, max_batch_size=size).generate(shuffled)
        assert {r["request_id"]: r for r in got} == baseline
    alone = Engine(CFG, weights, max_batch_size=2).generate([requests[3]])
    assert alone[0] == baseline["r3"]


def test_different_seeds_differ(weights):
    reqs = _requests(2)
    reqs[1] = dict(reqs[0], request_id="other", seed=reqs[0]["seed"] + 1)
    a, b = Engine(CFG, weights).generate(reqs)
    assert a["output_ids"] != b["output_ids"]


def test_stops_on_eos_and_on_length(weights):
    greedy = _requests(1, max_new=8, temperature=0.0)
    (free,) = Engine(CFG, weights).generate(greedy)
    assert free["finish_reason"] == "length" and len(free["output_ids"]) == 8
    eos = free["output_ids"][3]
    first = free["output_ids"].index(eos)
    (stopped,) = Engine(CFG, weights, eos_token_id=eos).generate(greedy)
    assert stopped["finish_reason"] == "eos"
    assert stopped["output_ids"] == free["output_ids"][: first + 1]
    assert stopped["logprobs"] == free["logprobs"][: first + 1]


def test_length_is_capped_by_max_position(weights):
    req = dict(_requests(1)[0], prompt_ids=[i % 64 for i in range(90)], max_new_tokens=50)
    (result,) = Engine(CFG, weights).generate([req])
    assert len(result["output_ids"]) == CFG.max_position - 90 and result["finish_reason"] == "length"


def test_zero_new_tokens(weights):
    (result,) = Engine(CFG, weights).generate([dict(_requests(1)[0], max_new_tokens=0)])
    assert result["output_ids"] == [] and result["finish_reason"] == "length"


def test_greedy_picks_reference_argmax(reference, weights):
    (result,) = Engine(CFG, weights).generate(_requests(1, max_new=1, temperature=0.0))
    logits, _ = reference(torch.tensor([result["prompt_ids"]]))
    assert result["output_ids"][0] == int(torch.argmax(logits[0, -1]))


def test_logprob_convention():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    gen = torch.Generator().manual_seed(0)
    tok, lp = sample_token(logits, temperature=0.5, top_p=1.0, generator=gen)
    assert lp == pytest.approx(float(torch.log_softmax(logits / 0.5, -1)[tok]), abs=1e-7)
    # A nucleus holding only the top token: always that token, logprob 0.
    tok, lp = sample_token(logits, temperature=1.0, top_p=0.01, generator=gen)
    assert tok == 0 and lp == 0.0


@pytest.mark.parametrize(
    "bad, field",
    [({"prompt_ids": []}, "prompt_ids"), ({"prompt_ids": [64]}, "prompt_ids"), ({"top_p": 0.0}, "top_p"),
     ({"temperature": -1}, "temperature"), ({"max_new_tokens": -1}, "max_new_tokens"), ({"seed": "x"}, "seed")],
)
def test_bad_requests_name_the_field(weights, bad, field):
    request = dict(_requests(1)[0], **bad)
    with pytest.raises(ValueError, match=f"'r0'.*{field}"):
        Engine(CFG, weights).generate([request])


def test_missing_field_is_named(weights):
    request = _requests(1)[0]
    del request["seed"]
    with pytest.raises(ValueError, match="missing field.*seed"):
        Engine(CFG, weights).generate([request])


def test_load_weights_is_bit_exact_and_checks_names(weights):
    engine = Engine(CFG, None)
    assert engine.load_weights(weights.items()) == list(weights)
    state = engine.state_dict()
    assert all(torch.equal(state[n], weights[n]) for n in weights)
    with pytest.raises(ValueError, match="no parameter named 'bogus'"):
        engine.load_weights([("bogus", torch.zeros(1))])
    with pytest.raises(ValueError, match="lm_head.weight: shape"):
        engine.load_weights([("lm_head.weight", torch.zeros(3))])


@pytest.mark.parametrize("tp", [2, 4])
def test_shard_unshard_roundtrip(weights, tp):
    plans = [ShardPlan(CFG, r, tp) for r in range(tp)]
    for name, full in weights.items():
        shards = [p.shard(name, full).clone() for p in plans]
        assert all(tuple(s.shape) == p.local_shape(name, tuple(full.shape)) for s, p in zip(shards, plans))
        assert torch.equal(plans[0].unshard(name, shards), full), name


def test_shard_plan_rejects_indivisible_tp():
    with pytest.raises(ValueError, match="model.heads"):
        ShardPlan(CFG, 0, 3)
