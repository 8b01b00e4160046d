"""The reference model's stacked expert layout (``expert_layout="stacked"``) keeps every
external layout of the per-expert one: ``state_dict`` keys, order, shapes and values (the
refit stream's names and shapes, ``hf_weight_shapes``), ``init_weights`` draws,
``reference_state_dict``, state dicts and files written by the per-expert layout, and the
forward's bits (CPU loop; the grouped path through torch's CPU ``_grouped_mm``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import harness.model.qwen3_moe as mod
from harness.model.config import ModelConfig
from harness.model.qwen3_moe import (
    ExpertStack,
    Qwen3MoeForCausalLM,
    build_reference_model,
    hf_fused_state_dict,
    reference_state_dict,
)
from harness.rollout.sharding import hf_weight_shapes

CFG = ModelConfig(layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, experts=4, top_k=2,
                  moe_intermediate=16, vocab=64, max_position=64)
IDS = torch.randint(0, CFG.vocab, (2, 12), generator=torch.Generator().manual_seed(0))


def _assert_same_state(got: dict, want: dict) -> None:
    assert list(got) == list(want)  # names and order
    for k, v in want.items():
        assert got[k].shape == v.shape and got[k].dtype == v.dtype, k
        assert torch.equal(got[k], v), k


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stacked_state_dict_is_the_per_expert_one(dtype):
    cfg = dataclasses.replace(CFG, dtype=dtype)
    per_expert = build_reference_model(cfg, seed=5).state_dict()
    stacked_model = build_reference_model(cfg, seed=5, expert_layout="stacked")
    stacked = stacked_model.state_dict()
    _assert_same_state(stacked, per_expert)
    _assert_same_state(stacked, reference_state_dict(cfg, 5))
    # the refit stream's names and full shapes, in model order
    assert {k: tuple(v.shape) for k, v in stacked.items()} == hf_weight_shapes(cfg)
    assert list(stacked) == list(hf_weight_shapes(cfg))
    # inside: two expert parameters a layer, [E, 2I, H] (gate rows, then up) and [E, H, I]
    params = dict(stacked_model.named_parameters())
    gate_up = params["model.layers.1.mlp.experts.gate_up_proj"]
    assert gate_up.shape == (CFG.experts, 2 * CFG.moe_intermediate, CFG.hidden)
    assert params["model.layers.1.mlp.experts.down_proj"].shape == (CFG.experts, CFG.hidden, CFG.moe_intermediate)
    assert not any(".experts.0." in n for n in params)
    # transformers v5's fused layout is the stack itself
    fused = hf_fused_state_dict(stacked, cfg)
    assert torch.equal(fused["model.layers.1.mlp.experts.gate_up_proj"], gate_up.detach())


def test_layouts_load_each_others_state_dicts_and_files(tmp_path):
    old = build_reference_model(CFG, seed=9)
    torch.save(old.state_dict(), tmp_path / "per_expert.pt")  # a file written by the per-expert layout
    stacked = Qwen3MoeForCausalLM(CFG, expert_layout="stacked")
    stacked.load_state_dict(torch.load(tmp_path / "per_expert.pt", weights_only=True), strict=True)
    _assert_same_state(stacked.state_dict(), old.state_dict())
    with torch.no_grad():
        want = old(IDS)[0]
        assert torch.equal(stacked(IDS)[0], want)  # the CPU per-expert loop over the stacks' views
    torch.save(stacked.state_dict(), tmp_path / "stacked.pt")
    back = Qwen3MoeForCausalLM(CFG)
    back.load_state_dict(torch.load(tmp_path / "stacked.pt", weights_only=True), strict=True)
    _assert_same_state(back.state_dict(), old.state_dict())
    # the two stacked keys load too (a stacked model's own parameters)
    again = Qwen3MoeForCausalLM(CFG, expert_layout="stacked")
    again.load_state_dict({n: p.detach() for n, p in stacked.named_parameters()}, strict=True)
    _assert_same_state(again.state_dict(), old.state_dict())


def test_an_incomplete_per_expert_state_dict_is_refused_by_name():
    sd = build_reference_model(CFG, seed=9).state_dict()
    del sd["model.layers.1.mlp.experts.3.up_proj.weight"]
    with pytest.raises(RuntimeError, match=r"model\.layers\.1\.mlp\.experts\.3\.up_proj\.weight \(1 of 12\)"):
        Qwen3MoeForCausalLM(CFG, expert_layout="stacked").load_state_dict(sd)
    with pytest.raises(ValueError, match="expert_layout"):
        Qwen3MoeForCausalLM(CFG, expert_layout="fused")


def test_stacked_grouped_forward_and_gradients_equal_the_per_expert_layouts(monkeypatch):
    """The grouped path (cuda's; forced here, torch's CPU ``_grouped_mm``): the stacks are the
    operands `stack_experts` built per forward, so logits and gradients are bit-equal."""
    monkeypatch.setattr(mod, "use_grouped", lambda t: True)
    old = build_reference_model(CFG, seed=4)
    new = build_reference_model(CFG, seed=4, expert_layout="stacked")
    outs = []
    for m in (old, new):
        logits, router = m(IDS)
        (logits.square().mean() + m.aux_loss(router)).backward()
        outs.append(logits)
    assert torch.equal(outs[0], outs[1])
    grads = {n: p.grad for n, p in old.named_parameters()}
    for name, p in new.named_parameters():
        if isinstance(new.get_submodule(name.rpartition(".")[0]), ExpertStack):
            continue
        assert torch.equal(p.grad, grads[name]), name
    for i in range(CFG.layers):
        stack = new.model.layers[i].mlp.experts
        for e in range(CFG.experts):
            pre = f"model.layers.{i}.mlp.experts.{e}."
            for got, w in zip(stack.expert_weights(e, stack.gate_up_proj.grad, stack.down_proj.grad),
                              ("gate_proj", "up_proj", "down_proj")):
                assert torch.equal(got, grads[pre + w + ".weight"]), pre + w


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (L2: ci/l2.sh on a GPU machine)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_stacked_layout_is_bit_equal_to_the_per_expert_layout(dtype):
    cfg = ModelConfig(layers=2, hidden=64, heads=8, kv_heads=2, head_dim=16, experts=8, top_k=2,
                      moe_intermediate=32, vocab=256, max_position=128)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0)).cuda()
    grads, outs = [], []
    for layout in ("per_expert", "stacked"):
        m = build_reference_model(cfg, seed=3, expert_layout=layout).to(device="cuda", dtype=dtype)
        assert mod.use_grouped(m.model.embed_tokens.weight)
        logits, _ = m(ids)
        logits.float().square().mean().backward()
        outs.append(logits)
        grads.append({n: p.grad for n, p in m.named_parameters()})
        if layout == "stacked":
            stack = m.model.layers[1].mlp.experts
            got = stack.expert_weights(5, stack.gate_up_proj.grad, stack.down_proj.grad)
    assert torch.equal(outs[0], outs[1])
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(grads[1][q], grads[0][q])
    for g, w in zip(got, ("gate_proj", "up_proj", "down_proj")):
        assert torch.equal(g, grads[0][f"model.layers.1.mlp.experts.5.{w}.weight"])
