"""The batch-invariant decode kernels (``decode_kernels="invariant"``), run on the CPU.

On a GPU they are what lets the engine decode its rows together with the
per-request guarantee; the kernels are plain element-wise ops, so the CPU runs the
same code. The tests check the guarantee (a request's tokens and logprobs equal
its run alone), the fold's padding property it rests on, and that the probe and
the engine refuse what cannot hold.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.rollout.native import invariant, probe
from harness.rollout.native.engine import Engine
from harness.rollout.native.forward import Forward
from suites.tiny_engine import DECODE_CFG, reference_weights
from suites.torch_state import one_deterministic_thread  # noqa: F401 (module-scoped autouse fixture)

CFG = DECODE_CFG


@pytest.fixture(scope="module")
def weights():
    return reference_weights(CFG, 5)


@pytest.fixture(scope="module")
def engine(weights):
    return Engine(CFG, weights, max_batch_size=9, decode_kernels="invariant")


def _reqs(n=9, max_new=12):
    return [dict(request_id=i, prompt_ids=[(13 * i + 7 * j) % 256 for j in range(3 + i % 6)],
                 max_new_tokens=max_new - i % 4, seed=i, temperature=(1.0, 0.0, 0.7)[i % 3],
                 top_p=(1.0, 1.0, 0.9, 1.0)[i % 4]) for i in range(n)]


def test_fold_sum_is_row_local_and_blind_to_extra_zero_padding():
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 37, generator=gen)
    alone = [invariant.fold_sum(rows[i : i + 1]) for i in range(6)]
    batched = invariant.fold_sum(rows)
    padded = invariant.fold_sum(torch.cat((rows, torch.zeros(6, 100)), dim=1))  # 137 -> 256 wide
    for i in range(6):
        assert torch.equal(batched[i], alone[i][0]) and torch.equal(padded[i], alone[i][0])
    assert torch.allclose(batched.view(-1), rows.sum(-1), rtol=1e-5, atol=1e-5)
    assert invariant.fold_sum(rows, dim=0).shape == (1, 37)


def test_decode_attention_row_does_not_see_the_batchs_longer_rows():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, 2, 4, 16, generator=gen)
    k, v = torch.randn(3, 2, 40, 16, generator=gen), torch.randn(3, 2, 40, 16, generator=gen)
    lengths = torch.tensor([5, 17, 40])
    got = invariant.decode_attention(q, k, v, lengths)
    for i, n in enumerate(lengths.tolist()):
        alone = invariant.decode_attention(q[i : i + 1], k[i : i + 1, :, :n], v[i : i + 1, :, :n], lengths[i : i + 1])
        assert torch.equal(got[i], alone[0])
        ref = torch.softmax(q[i] @ k[i, :, :n].transpose(-1, -2) / 4.0, dim=-1) @ v[i, :, :n]
        assert torch.allclose(got[i], ref.reshape(-1), atol=1e-5)


def test_invariant_engine_gives_each_request_its_bits_alone(engine, weights):
    assert engine.decode_kernels == "invariant" and engine.batched_decode
    reqs = _reqs()
    alone = Engine(CFG, weights, max_batch_size=1, decode_kernels="invariant")
    want = [alone.generate([r])[0] for r in reqs]
    assert engine.generate(reqs) == want
    three = Engine(CFG, weights, max_batch_size=3, decode_kernels="invariant")  # other compositions and slots
    assert three.generate(list(reversed(reqs))) == list(reversed(want))


def test_invariant_kernels_agree_with_the_standard_ones_to_rounding(engine, weights):
    reqs = [dict(r, temperature=0.0) for r in _reqs()]
    standard = Engine(CFG, weights, max_batch_size=9)
    assert standard.decode_kernels == "standard"
    got, ref = engine.generate(reqs), standard.generate(reqs)
    assert [r["output_ids"] for r in got] == [r["output_ids"] for r in ref]
    diffs = [abs(a - b) for g, r in zip(got, ref) for a, b in zip(g["logprobs"], r["logprobs"])]
    assert max(diffs) < 1e-4


def test_probe_names_an_invariant_path_that_drifts_and_the_engine_refuses(engine, weights, monkeypatch):
    real = Forward.decode_moe_invariant

    def drifting(self, li, x):  # the last row off by one ulp when it shares the batch: the guarantee broken
        out = real(self, li, x)
        if out.shape[0] > 1:
            out[-1] = torch.nextafter(out[-1], torch.full_like(out[-1], float("inf")))
        return out

    monkeypatch.setattr(Forward, "decode_moe_invariant", drifting)
    problem = probe.probe_invariant(engine.forward, 9)
    assert problem is not None and "batch of 2" in problem and engine.forward.kernels == "standard"
    with pytest.raises(ValueError, match="invariant decode kernels requested but unavailable on cpu: batched"):
        Engine(CFG, weights, max_batch_size=4, decode_kernels="invariant")
    engine.forward.kernels = "invariant"  # the module's engine, as it was


def test_the_environment_picks_the_default_kernels(weights, monkeypatch):
    monkeypatch.setenv("HARNESS_NATIVE_DECODE_KERNELS", "invariant")
    assert Engine(CFG, weights, max_batch_size=2).decode_kernels == "invariant"
    assert Engine(CFG, weights, max_batch_size=2, decode_kernels="standard").decode_kernels == "standard"
    monkeypatch.setenv("HARNESS_NATIVE_DECODE_KERNELS", "quick")
    with pytest.raises(ValueError, match=r"\$HARNESS_NATIVE_DECODE_KERNELS\) must be one of"):
        Engine(CFG, weights)
    monkeypatch.delenv("HARNESS_NATIVE_DECODE_KERNELS")
    assert Engine(CFG, weights, max_batch_size=2).decode_kernels == "standard"


def test_invalid_invariant_requests_are_refused(weights):
    with pytest.raises(ValueError, match="batched_decode=False contradicts it"):
        Engine(CFG, weights, decode_kernels="invariant", batched_decode=False)
    with pytest.raises(ValueError, match=r"decode_kernels \(or \$HARNESS_NATIVE_DECODE_KERNELS\) must be one of"):
        Engine(CFG, weights, decode_kernels="fast")
    fp16 = dataclasses.replace(CFG, dtype="float16")
    with pytest.raises(ValueError, match="dtype torch.float16 is not one of"):
        Engine(fp16, None, decode_kernels="invariant")


def test_bf16_invariant_engine_accumulates_in_fp32_and_keeps_the_guarantee(weights):
    """bf16 weights, fp32 products and folds: each request's bits equal its run alone, and the
    logprobs stay near the fp32 engine's (a bf16 accumulation would drift far more)."""
    bf16 = dataclasses.replace(CFG, dtype="bfloat16")
    w16 = {n: t.to(torch.bfloat16) for n, t in weights.items()}
    engine = Engine(bf16, w16, max_batch_size=9, decode_kernels="invariant")
    assert engine.batched_decode and engine.decode_kernels == "invariant"
    reqs = _reqs(max_new=8)
    alone = Engine(bf16, w16, max_batch_size=1, decode_kernels="invariant")
    got = engine.generate(reqs)
    assert got == [alone.generate([r])[0] for r in reqs]
    x = torch.randn(3, CFG.hidden, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    w = w16["lm_head.weight"]
    y = invariant.linear(x, w)
    assert y.dtype == torch.bfloat16
    ref = x.float() @ w.float().t()  # the fp32 product of the same bf16 operands
    assert bool(((y.float() - ref).abs() <= ref.abs() * 2**-8 + 1e-6).all())  # one rounding: half a bf16 ulp


def test_the_device_default_yields_to_per_request_decode_and_falls_back_with_a_warning(
        weights, monkeypatch, caplog):
    """Where ``invariant`` is only the device default (cuda), ``batched_decode=False`` selects the
    standard per-request decode and a failing probe falls back with its reason (never silently);
    asked for explicitly, the same failure is a ValueError. Run here with the CPU made to default
    to ``invariant``."""
    import harness.rollout.native.engine as engine_mod

    assert engine_mod.default_decode_kernels(torch.device("cuda")) == "invariant"
    assert engine_mod.default_decode_kernels(torch.device("cpu")) == "standard"
    monkeypatch.delenv("HARNESS_NATIVE_DECODE_KERNELS", raising=False)
    monkeypatch.setattr(engine_mod, "default_decode_kernels", lambda device: "invariant")
    assert Engine(CFG, weights, max_batch_size=2).decode_kernels == "invariant"
    per_request = Engine(CFG, weights, max_batch_size=2, batched_decode=False)
    assert per_request.decode_kernels == "standard" and not per_request.batched_decode
    monkeypatch.setattr(probe, "probe_invariant", lambda fwd, n: "a planted failure")
    with caplog.at_level("WARNING", logger="harness.rollout.native.probe"):
        fallback = Engine(CFG, weights, max_batch_size=2)
    assert fallback.decode_kernels == "standard"
    assert any("invariant decode kernels off (a planted failure)" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="requested but unavailable on cpu: a planted failure"):
        Engine(CFG, weights, max_batch_size=2, decode_kernels="invariant")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (L2: ci/l2.sh on a GPU machine)")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_cuda_the_default_is_invariant_and_each_request_gets_its_bits_alone(weights, dtype):
    cfg = dataclasses.replace(CFG, dtype=dtype)
    w = {n: t.to(cfg.torch_dtype()) for n, t in weights.items()}
    engine = Engine(cfg, w, max_batch_size=9, device="cuda")
    assert engine.decode_kernels == "invariant" and engine.batched_decode
    reqs = _reqs()
    alone = Engine(cfg, w, max_batch_size=1, device="cuda")
    assert engine.generate(reqs) == [alone.generate([r])[0] for r in reqs]
