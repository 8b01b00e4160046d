"""Grouped expert GEMMs (`harness.model.grouped`): the per-expert SwiGLU loop's math in two matmuls.

The grouped path runs only on cuda, bf16 and fp32 (`use_grouped`); here torch's CPU
implementation of `torch._grouped_mm` checks the math (values and gradients)
against `ops.swiglu` per expert, and that no CPU tensor takes the grouped path.
"""

from __future__ import annotations

import pytest
import torch

from harness import ops
from harness.model.config import ModelConfig
from harness.model.grouped import grouped_dtypes, grouped_swiglu, stack_experts, use_grouped

E, H, INTER = 4, 16, 8


def _experts(gen):
    return [tuple(torch.randn(*shape, generator=gen).requires_grad_() for shape in ((INTER, H), (INTER, H), (H, INTER)))
            for _ in range(E)]


def test_grouped_swiglu_equals_the_per_expert_loop_values_and_gradients():
    gen = torch.Generator().manual_seed(0)
    experts = _experts(gen)
    counts = torch.tensor([4, 0, 5, 2])  # an expert with no slots too
    x = torch.randn(int(counts.sum()), H, generator=gen).requires_grad_()
    got = grouped_swiglu(x, *stack_experts(experts), counts)
    parts, start = [], 0
    for (g, u, d), n in zip(experts, counts.tolist()):
        parts.append(ops.swiglu(x[start : start + n], g, u, d))
        start += n
    want = torch.cat(parts)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    w = torch.randn(want.shape, generator=gen)
    leaves = [t for ex in experts for t in ex] + [x]
    grads_got = torch.autograd.grad((got * w).sum(), leaves, allow_unused=True)
    grads_want = torch.autograd.grad((want * w).sum(), leaves, allow_unused=True)
    for a, b in zip(grads_got, grads_want):
        torch.testing.assert_close(torch.zeros(1) if a is None else a, torch.zeros(1) if b is None else b,
                                   rtol=1e-5, atol=1e-4)


def test_only_cuda_takes_the_grouped_path_and_fp32_can_opt_out(monkeypatch):
    monkeypatch.delenv("HARNESS_GROUPED_FP32", raising=False)
    assert not use_grouped(torch.zeros(2, 2))  # fp32 on the CPU: the loop
    assert not use_grouped(torch.zeros(2, 2, dtype=torch.bfloat16))  # bf16 on the CPU: the loop
    assert grouped_dtypes() == (torch.bfloat16, torch.float32)  # cuda: both by default
    monkeypatch.setenv("HARNESS_GROUPED_FP32", "0")  # the opt-out: fp32 back to the loop on cuda
    assert grouped_dtypes() == (torch.bfloat16,)
    monkeypatch.setenv("HARNESS_GROUPED_FP32", "1")
    assert grouped_dtypes() == (torch.bfloat16, torch.float32)
    assert not use_grouped(torch.zeros(2, 2))


def test_stack_experts_gives_the_per_expert_concatenation_in_its_layout():
    """Two stacks and a cat, not a cat per expert: the same values, shape and strides (so the
    grouped kernel, chosen by layout, and its bits do not change)."""
    experts = _experts(torch.Generator().manual_seed(2))
    gate_up, down = stack_experts(experts)
    want = torch.stack([torch.cat((g, u), dim=0) for g, u, _ in experts]).transpose(1, 2)
    assert torch.equal(gate_up, want) and gate_up.stride() == want.stride()
    assert torch.equal(down, torch.stack([d for _, _, d in experts]).transpose(1, 2))
    (gate_up.sum() * 2 + down.sum()).backward()
    assert all(torch.equal(g.grad, torch.full_like(g, 2.0)) and torch.equal(d.grad, torch.ones_like(d))
               for g, _, d in experts)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (L2: ci/l2.sh on a GPU machine)")
def test_cuda_bf16_reference_model_grouped_matches_the_loop():
    from harness.model.qwen3_moe import build_reference_model

    cfg = ModelConfig(layers=2, hidden=64, heads=8, kv_heads=2, head_dim=16, experts=8, top_k=2,
                      moe_intermediate=32, vocab=256, max_position=128)
    model = build_reference_model(cfg, seed=3).to(device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0)).cuda()
    assert use_grouped(model.model.embed_tokens.weight)
    grouped, _ = model(ids)
    import harness.model.qwen3_moe as mod

    real = mod.use_grouped
    mod.use_grouped = lambda x: False
    try:
        loop, _ = model(ids)
    finally:
        mod.use_grouped = real
    torch.testing.assert_close(grouped.float(), loop.float(), rtol=0.05, atol=0.05)


def test_engine_moe_partial_grouped_over_the_packed_weights_matches_its_loop(monkeypatch):
    """The engine's per-request MoE through the grouped path (forced here: on cuda bf16 it is
    the default) over its packed expert weights, against its per-expert loop."""
    import harness.rollout.native.forward as fwd_mod
    from harness.model.qwen3_moe import build_reference_model
    from harness.rollout.native.engine import Engine

    cfg = ModelConfig(layers=1, hidden=64, heads=8, kv_heads=2, head_dim=16, experts=8, top_k=2,
                      moe_intermediate=32, vocab=256, max_position=64)
    w = {n: t.detach() for n, t in build_reference_model(cfg, seed=3).state_dict().items()}
    engine = Engine(cfg, w, max_batch_size=1, batched_decode=False)
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(0))
    loop = engine.forward.moe_partial(0, x)
    monkeypatch.setattr(fwd_mod, "use_grouped", lambda t: True)
    grouped = engine.forward.moe_partial(0, x)
    torch.testing.assert_close(grouped, loop, rtol=1e-5, atol=1e-5)
