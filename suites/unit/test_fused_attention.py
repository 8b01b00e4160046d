"""Dense causal attention through torch's fused kernel (``ops.causal_attention(dense=True)``,
cuda bf16 only; issue 20's bf16 forward+backward).

On the CPU: ``dense`` changes no bit (the explicit fp32-softmax path runs), fp32 and CPU
tensors never take the fused path, ``$HARNESS_FUSED_ATTENTION=0`` opts out, and the
reference model and the context-parallel attention pass ``dense`` only for a whole
sequence. On cuda (L2): the fused result is close to the explicit one, its backward is
bit-identical run to run (deterministic algorithms on), and a bf16 reference model's
forward takes it.
"""

from __future__ import annotations

import pytest
import torch

from harness import ops
from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from suites.torch_state import one_deterministic_thread  # noqa: F401 (a module-scoped autouse fixture)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (L2: ci/l2.sh on a GPU machine)")
CFG = ModelConfig(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, experts=4, top_k=2, moe_intermediate=32,
                  vocab=64, max_position=64)


def _qkv(device="cpu", dtype=torch.float32, b=2, s=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, 4, 16, generator=gen).to(device, dtype)
    k = torch.randn(b, s, 2, 16, generator=gen).to(device, dtype)
    v = torch.randn(b, s, 2, 16, generator=gen).to(device, dtype)
    return q, k, v, torch.arange(s, device=device)


def test_on_the_cpu_dense_changes_no_bit_in_fp32_and_bf16():
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v, pos = _qkv(dtype=dtype)
        assert not ops.use_fused_attention(q)
        assert torch.equal(ops.causal_attention(q, k, v, pos, pos, dense=True), ops.causal_attention(q, k, v, pos, pos))


def test_only_cuda_bf16_takes_the_fused_path_and_it_can_be_turned_off(monkeypatch):
    class FakeCuda:  # a stand-in for a cuda tensor's two attributes the choice reads (no GPU here)
        is_cuda = True

        def __init__(self, dtype):
            self.dtype = dtype

    monkeypatch.delenv(ops.FUSED_ATTENTION_ENV, raising=False)
    assert ops.use_fused_attention(FakeCuda(torch.bfloat16))
    assert not ops.use_fused_attention(FakeCuda(torch.float32))  # the fp32 goldens keep the explicit softmax
    monkeypatch.setenv(ops.FUSED_ATTENTION_ENV, "0")
    assert not ops.use_fused_attention(FakeCuda(torch.bfloat16))


def test_only_whole_sequences_are_passed_as_dense(monkeypatch):
    seen = []
    real = ops.causal_attention

    def spy(*args, dense=False, **kw):
        seen.append(dense)
        return real(*args, dense=dense, **kw)

    monkeypatch.setattr(ops, "causal_attention", spy)
    model = build_reference_model(CFG, seed=0)
    ids = torch.randint(0, CFG.vocab, (2, 8), generator=torch.Generator().manual_seed(1))
    model(ids)
    assert seen == [True] * CFG.layers
    seen.clear()
    model(ids, positions=torch.arange(8) + 3)  # positions given: not 0..S-1, never dense
    assert seen == [False] * CFG.layers


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_the_fused_attention_is_close_to_the_explicit_one_and_deterministic():
    torch.use_deterministic_algorithms(True)
    q, k, v, pos = _qkv("cuda", torch.bfloat16, b=4, s=256)
    want = ops.causal_attention(q.float(), k.float(), v.float(), pos, pos)

    def fwd_bwd():
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = ops.causal_attention(qq, kk, vv, pos, pos, dense=True)
        out.float().square().sum().backward()
        return out.detach(), qq.grad, kk.grad, vv.grad

    first, second = fwd_bwd(), fwd_bwd()
    torch.testing.assert_close(first[0].float(), want, rtol=0.02, atol=0.02)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_a_bf16_reference_model_takes_the_fused_attention(monkeypatch):
    import dataclasses

    calls = []
    real = ops._fused_causal_attention
    monkeypatch.setattr(ops, "_fused_causal_attention", lambda *a: calls.append(1) or real(*a))
    model = build_reference_model(dataclasses.replace(CFG, dtype="bfloat16"), seed=0).cuda()
    model(torch.zeros((2, 16), dtype=torch.long, device="cuda"))
    assert len(calls) == CFG.layers
