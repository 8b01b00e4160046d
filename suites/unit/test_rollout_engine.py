"""The native engine on one process: math, determinism, batch invariance, stopping."""

from __future__ import annotations

import pytest
import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.rollout.native.engine import Engine
from harness.rollout.native.sampling import sample_token
from harness.rollout.sharding import ShardPlan, hf_weight_shapes
from suites.torch_state import one_deterministic_thread  # noqa: F401 (a module-scoped autouse fixture)

CFG = ModelConfig(layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, experts=4, top_k=2,
                  moe_intermediate=16, vocab=64, max_position=96)


@pytest.fixture(scope="module")
def reference():
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
    assert torch.equal(got, want)  # bit for bit: prefill runs the reference model's shapes


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


# -- batched decode: bit-identical to the per-request decode, batch-invariant -----------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from harness.rollout.native.sampling import sample_rows  # noqa: E402

# Dims that exercise every fallback: K*N < 400 products (router: per-row F.linear), I = 24
# (silu scalar tails), top_k 3 of 5 experts, vocab 100 (per-row sampling fallback).
ODD = ModelConfig(layers=2, hidden=48, heads=6, kv_heads=3, head_dim=8, experts=5, top_k=3,
                  moe_intermediate=24, vocab=100, max_position=80)


def _pool(cfg, n=10):
    """Requests with varied prompts (some shared: the prefill dedup), lengths, sampling settings."""
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, cfg.vocab, (int(torch.randint(1, 24, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(n // 2)]
    settings_ = [(1.0, 1.0), (0.0, 1.0), (0.7, 1.0), (1.0, 0.9), (1.3, 0.5)]
    return [
        dict(request_id=f"p{i}", prompt_ids=prompts[i % len(prompts)], max_new_tokens=int(3 + (7 * i) % 14),
             seed=1000 + i, temperature=settings_[i % 5][0], top_p=settings_[i % 5][1])
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def odd_weights():
    return {n: t.detach() for n, t in build_reference_model(ODD, seed=5).state_dict().items()}


@pytest.fixture(scope="module")
def alone(weights, odd_weights):
    """Each pool request generated alone, request by request (the invariant by construction)."""
    out = {}
    for name, cfg, w in (("cfg", CFG, weights), ("odd", ODD, odd_weights)):
        engine = Engine(cfg, w, max_batch_size=1, batched_decode=False)
        out[name] = {r["request_id"]: engine.generate([r])[0] for r in _pool(cfg)}
    return out


@pytest.mark.parametrize("cfg", [CFG, ODD], ids=["cfg", "odd"])
def test_batched_decode_is_active_on_this_machine(cfg):
    """The start-up probe accepts this platform's kernels (else the engine would quietly run
    request by request: correct, but slow)."""
    engine = Engine(cfg, None, max_batch_size=8)
    assert engine.batched_decode
    assert Engine(cfg, None, batched_decode=False).batched_decode is False


@settings(max_examples=40)
@given(data=st.data(), max_batch=st.integers(1, 9), which=st.sampled_from(["cfg", "odd"]))
def test_batch_invariance_over_random_compositions(weights, odd_weights, alone, data, max_batch, which):
    """Any subset, order and max_batch_size: every request's tokens and logprobs equal its
    solo per-request result bit for bit (batched decode, prompt dedup, slot reuse)."""
    cfg, w = (CFG, weights) if which == "cfg" else (ODD, odd_weights)
    pool = _pool(cfg)
    picked = data.draw(st.lists(st.sampled_from(range(len(pool))), min_size=1, max_size=len(pool), unique=True))
    eos = data.draw(st.sampled_from([None, 3]))
    requests = [pool[i] for i in picked]
    engine = Engine(cfg, w, max_batch_size=max_batch, eos_token_id=eos)
    got = engine.generate(requests)
    if eos is None:
        assert got == [alone[which][r["request_id"]] for r in requests]
    else:  # EOS truncates: compare with the solo per-request run under the same EOS
        solo = Engine(cfg, w, max_batch_size=1, batched_decode=False, eos_token_id=eos)
        assert got == [solo.generate([r])[0] for r in requests]


def test_batched_equals_per_request_on_the_bench_shapes():
    """The tiny workload config (hidden 64, 8 experts): every product on the fused BLAS path."""
    cfg = ModelConfig(layers=2, hidden=64, heads=8, kv_heads=2, head_dim=16, experts=8, top_k=2,
                      moe_intermediate=32, vocab=256, max_position=128)
    w = {n: t.detach() for n, t in build_reference_model(cfg, seed=3).state_dict().items()}
    reqs = [dict(request_id=i, prompt_ids=[(11 * i + j) % 256 for j in range(4 + i % 5)], max_new_tokens=12,
                 seed=i, temperature=1.0 if i % 3 else 0.0, top_p=1.0) for i in range(10)]
    fast = Engine(cfg, w, max_batch_size=8)
    layer = fast.packed.layers[0]
    assert (layer.qkv_proj.mode, layer.o_proj.mode, layer.router_proj.mode, layer.experts.mode) == ("fused",) * 4
    assert fast.generate(reqs) == Engine(cfg, w, max_batch_size=8, batched_decode=False).generate(reqs)


@settings(max_examples=30)
@given(ids=st.lists(st.integers(0, CFG.vocab - 1), min_size=1, max_size=CFG.max_position - 1))
def test_prompt_logprobs_equal_reference_model_exactly(reference, weights, ids):
    engine = Engine(CFG, weights, max_batch_size=1)
    assert torch.equal(engine.prompt_logprobs(ids), reference.logprobs(torch.tensor([ids]))[0])


def test_refit_updates_every_packed_view(weights):
    """Parameters are views into packed tensors (plus a per-head q/k-norm copy): a refit
    must give the results of an engine built on the new weights."""
    new = {n: t.detach() for n, t in build_reference_model(CFG, seed=12).state_dict().items()}
    new = {n: (t * 1.5 if n.endswith("norm.weight") else t) for n, t in new.items()}
    engine = Engine(CFG, weights, max_batch_size=4)
    engine.load_weights(new.items())
    assert engine.generate(_requests()) == Engine(CFG, new, max_batch_size=4).generate(_requests())
    assert all(torch.equal(t, new[n]) for n, t in engine.state_dict().items())


@settings(max_examples=40)
@given(rows=st.integers(1, 9), vocab=st.sampled_from([64, 100, 256]), data=st.data())
def test_sample_rows_equals_sample_token_per_row(rows, vocab, data):
    seed = data.draw(st.integers(0, 2**31 - 1))
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    temps = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.7]), min_size=rows, max_size=rows))
    top_ps = data.draw(st.lists(st.sampled_from([1.0, 1.0, 0.95, 0.3]), min_size=rows, max_size=rows))
    gens = [torch.Generator().manual_seed(seed + i) for i in range(rows)]
    want = [sample_token(logits[i].clone(), temperature=temps[i], top_p=top_ps[i],
                         generator=torch.Generator().manual_seed(seed + i)) for i in range(rows)]
    tokens, logprobs = sample_rows(logits, temperatures=temps, top_ps=top_ps, generators=gens)
    assert list(zip(tokens, logprobs)) == want


def _tp_worker(rank: int, port: int, out_dir: str) -> None:
    """One TP rank (spawned): per-request vs batched decode, two orders, two batch sizes."""
    import json

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        group = dist.new_group([0, 1])
        w = {n: t.detach() for n, t in build_reference_model(CFG, seed=11).state_dict().items()}
        requests = _pool(CFG)
        runs = {}
        for name, kw in (("per_request", dict(batched_decode=False, max_batch_size=3)),
                         ("batched", dict(max_batch_size=3)), ("batched_wide", dict(max_batch_size=8)),
                         ("invariant_alone", dict(max_batch_size=1, decode_kernels="invariant")),
                         ("invariant_wide", dict(max_batch_size=8, decode_kernels="invariant"))):
            engine = Engine(CFG, w, tp_rank=rank, tp_size=2, tp_group=group, **kw)
            runs[name] = {"forward": engine.generate(requests), "reversed": engine.generate(requests[::-1])[::-1],
                          "batched_decode": engine.batched_decode}
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump(runs, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_tp2_batched_decode_is_exact_and_rank_identical(tmp_path):
    """TP = 2 over gloo: batched decode equals per-request decode, both ranks hold the same
    tokens (rank-order TP sum), and order / max_batch_size change nothing."""
    import json
    import socket

    import torch.multiprocessing as tmp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp.spawn(_tp_worker, args=(port, str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]
    runs = ranks[0]
    assert runs["batched"]["batched_decode"] and not runs["per_request"]["batched_decode"]
    want = runs["per_request"]["forward"]
    for name in ("per_request", "batched", "batched_wide"):
        assert runs[name]["forward"] == want and runs[name]["reversed"] == want, name
    alone = runs["invariant_alone"]["forward"]  # the invariant kernels: batch-free among themselves
    assert alone != want  # other kernels (other rounding): not a copy of the standard run
    for name in ("invariant_alone", "invariant_wide"):
        assert runs[name]["forward"] == alone and runs[name]["reversed"] == alone, name
