"""The GPU half of the start-up probe (`probe_decode`, `probe_sampling`), run here on the CPU.

On a GPU the engine runs both before it turns batched decode (and batched sampling)
on; on the CPU it does not (its engine_init must dispatch the operators it always
did). These tests run the same functions on the CPU kernels, where they must pass,
and on a deliberately perturbed batched path, where they must name the problem.
"""

from __future__ import annotations

import pytest
import torch

from harness.rollout.native import probe
from harness.rollout.native.engine import Engine
from harness.rollout.native.forward import Forward
from suites.tiny_engine import DECODE_CFG, reference_weights
from suites.torch_state import one_deterministic_thread  # noqa: F401 (a module-scoped autouse fixture)

CFG = DECODE_CFG


@pytest.fixture(scope="module")
def engine():
    w = reference_weights(CFG, 3)
    return Engine(CFG, w, max_batch_size=9)


def test_probe_decode_passes_on_these_kernels_and_frees_its_slots(engine):
    free = engine.kv.free_slots
    assert probe.probe_decode(engine.forward, 9) is None
    assert engine.kv.free_slots == free


def test_probe_decode_names_a_batched_path_that_drifts(engine, monkeypatch):
    real = Forward.decode_moe

    def drifting(self, li, x):  # the batched MoE off by one ulp in one row: the guarantee broken
        out = real(self, li, x)
        out[-1] = torch.nextafter(out[-1], torch.full_like(out[-1], float("inf")))
        return out

    monkeypatch.setattr(Forward, "decode_moe", drifting)
    problem = probe.probe_decode(engine.forward, 9)
    assert problem is not None and "batch of 2" in problem and "differ" in problem


def test_probe_sampling_passes_here_and_names_a_drifting_sampler(monkeypatch):
    assert probe.probe_sampling(torch.device("cpu"), CFG.vocab) is None
    real = probe.sample_rows

    def drifting(logits, **kw):
        tokens, logprobs = real(logits, **kw)
        return tokens, [v + 1e-7 for v in logprobs]

    monkeypatch.setattr(probe, "sample_rows", drifting)
    assert "sample_rows differs" in probe.probe_sampling(torch.device("cpu"), CFG.vocab)


def test_row_by_row_sampling_gives_the_batched_sampler_bits(engine):
    """The fallback when only the sampler fails the probe: batched logits, sampled per row."""
    reqs = _reqs()
    batched = engine.generate(reqs)
    engine.scheduler.batched_sampling = False
    try:
        assert engine.generate(reqs) == batched
    finally:
        engine.scheduler.batched_sampling = True


def test_a_cuda_request_for_batched_decode_that_cannot_hold_is_refused(engine, monkeypatch):
    """``batched_decode=True`` with a failing probe: a ValueError naming the device and the reason."""
    monkeypatch.setattr(probe, "probe_batched_kernels", lambda fwd, n: "no batched mode reproduces X")
    with pytest.raises(ValueError, match="unavailable on cpu: no batched mode reproduces X"):
        probe.choose_batched_decode(engine.forward, 9, True)
    assert probe.choose_batched_decode(engine.forward, 9, None) is False


def _reqs(n=9, max_new=10):
    return [dict(request_id=i, prompt_ids=[(11 * i + j) % 256 for j in range(4 + i % 5)], max_new_tokens=max_new,
                 seed=i, temperature=(1.0, 0.0, 0.7)[i % 3], top_p=1.0) for i in range(n)]


def test_row_local_decode_gives_the_per_request_bits(engine):
    """The GPU fallback (reductions and attention per row, GEMMs batched), run on these kernels."""
    reqs = _reqs()
    alone = Engine(CFG, engine.state_dict(), max_batch_size=1, batched_decode=False)
    want = [alone.generate([r])[0] for r in reqs]
    engine.forward.row_local = True
    try:
        assert engine.generate(reqs) == want
        assert probe.probe_decode(engine.forward, 9) is None
    finally:
        engine.forward.row_local = False


def test_device_probe_order_batched_then_row_local_then_refusal(engine, monkeypatch):
    fwd = engine.forward
    assert probe._probe_device(fwd, 9) is None and fwd.row_local is False  # these kernels: fully batched
    monkeypatch.setattr(probe, "probe_attention", lambda *a: "grouped decode attention differs at length 2")
    assert probe._probe_device(fwd, 9) is None and fwd.row_local is True
    real = Forward.decode_moe_rows

    def drifting(self, li, x):
        out = real(self, li, x)
        out[0] = torch.nextafter(out[0], torch.full_like(out[0], float("inf")))
        return out

    monkeypatch.setattr(Forward, "decode_moe_rows", drifting)
    problem = probe._probe_device(fwd, 9)
    assert problem is not None and problem.startswith("row-local decode:") and fwd.row_local is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (L2: ci/l2.sh on a GPU machine)")
def test_on_cuda_the_engine_is_batch_invariant_or_says_why_not(caplog):
    """On the GPU: the probe's verdict holds (batched == request by request, bit for bit), and a
    declined batched decode is announced with its reason at start, never silently."""
    w = reference_weights(CFG, 3)
    reqs = _reqs(max_new=12)
    with caplog.at_level("WARNING", logger="harness.rollout.native.probe"):
        fast = Engine(CFG, w, max_batch_size=9, device="cuda")
    if not fast.batched_decode:
        assert any("batched decode off" in r.getMessage() for r in caplog.records)
    if fast.decode_kernels == "invariant":  # the cuda default: each row's reference is its own batch of one
        alone = Engine(CFG, w, max_batch_size=1, device="cuda")
    else:
        alone = Engine(CFG, w, max_batch_size=1, device="cuda", batched_decode=False)
    assert fast.generate(reqs) == [alone.generate([r])[0] for r in reqs]
    standard = Engine(CFG, w, max_batch_size=9, device="cuda", decode_kernels="standard")
    if not standard.batched_decode:
        assert any("batched decode off" in r.getMessage() for r in caplog.records)
    per_request = Engine(CFG, w, max_batch_size=1, device="cuda", batched_decode=False)
    assert standard.generate(reqs) == [per_request.generate([r])[0] for r in reqs]
