"""The reference Qwen3-MoE equals transformers' Qwen3MoeForCausalLM numerically.

transformers is a test-only dependency (dev extra); the test is skipped without it.
"""

from __future__ import annotations

import pytest
import torch

from harness import ops as Fn
from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model, hf_fused_state_dict
from suites.optional import needs
from suites.torch_state import torch_settings

pytestmark = needs("transformers", "transformers is not installed (the dev extra has it)")

CFG = ModelConfig(layers=2)


def _hf_model(ours):
    import transformers  # imported when the test runs, not while pytest collects

    hf_cfg = transformers.Qwen3MoeConfig(**CFG.to_hf_dict())
    hf = transformers.Qwen3MoeForCausalLM(hf_cfg).to(torch.float32).eval()
    hf_params = dict(hf.named_parameters())
    sd = ours.state_dict()
    if any(".mlp.experts.gate_up_proj" in k for k in hf_params):  # transformers v5 fused layout
        sd = hf_fused_state_dict(sd, CFG)
    hf.load_state_dict(sd, strict=True)
    assert set(hf.state_dict()) == set(sd), "parameter names differ from HF"
    return hf


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    with torch_settings(threads=None, deterministic=True):
        ours = build_reference_model(CFG, seed=7)
        yield ours, _hf_model(ours)


def test_parameter_names_and_count_match_hf(models):
    ours, hf = models
    n_ours = sum(p.numel() for p in ours.parameters())
    n_hf = sum(p.numel() for p in hf.parameters())
    assert n_ours == n_hf


def test_logits_loss_and_grads_match_hf(models):
    ours, hf = models
    ids = torch.randint(0, CFG.vocab, (2, 32), generator=torch.Generator().manual_seed(3))
    logits, router_logits = ours(ids)
    out = hf(input_ids=ids, labels=ids, output_router_logits=True)
    torch.testing.assert_close(logits, out.logits, rtol=1e-5, atol=1e-5)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, CFG.vocab), ids[:, 1:].reshape(-1))
    hf_ce = out.loss - hf.config.router_aux_loss_coef * out.aux_loss
    torch.testing.assert_close(loss, hf_ce, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.aux_loss(router_logits), out.aux_loss, rtol=1e-5, atol=1e-6)
    # gradients of the CE loss agree (compared on the un-fused parameters)
    loss.backward()
    hf_ce.backward()
    g_ours = ours.model.layers[1].self_attn.q_norm.weight.grad
    g_hf = hf.model.layers[1].self_attn.q_norm.weight.grad
    torch.testing.assert_close(g_ours, g_hf, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ours.lm_head.weight.grad, hf.lm_head.weight.grad, rtol=1e-4, atol=1e-7)


def test_logprobs_align_with_input_ids(models):
    ours, _ = models
    ids = torch.randint(0, CFG.vocab, (1, 8), generator=torch.Generator().manual_seed(4))
    lp = ours.logprobs(ids)
    logits, _ = ours(ids)
    assert lp[0, 0] == 0
    expect = torch.log_softmax(logits[0, 2], -1)[ids[0, 3]]
    torch.testing.assert_close(lp[0, 3], expect)


def test_init_is_a_pure_function_of_seed():
    a = build_reference_model(CFG, seed=11).state_dict()
    b = build_reference_model(CFG, seed=11).state_dict()
    c = build_reference_model(CFG, seed=12).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])


def test_route_renormalises_topk():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    probs, w, idx = Fn.route(logits, 2, True)
    assert idx.tolist() == [[3, 2]]
    torch.testing.assert_close(w.sum(-1), torch.ones(1))
    _, w2, _ = Fn.route(logits, 2, False)
    torch.testing.assert_close(w2, probs[:, [3, 2]])


def test_config_rejects_bad_fields_by_name():
    with pytest.raises(ValueError, match="model.heads"):
        ModelConfig(heads=6, kv_heads=4)
    with pytest.raises(ValueError, match="model.head_dim"):
        ModelConfig(head_dim=15)
    with pytest.raises(ValueError, match="model.bogus"):
        ModelConfig.from_spec({"model": {"bogus": 1}})
    assert ModelConfig.from_spec({"model": ModelConfig().to_dict()}) == ModelConfig()
