"""`MasterWeightsAdamW`: fp32 masters and AdamW state under a bf16 model."""

from __future__ import annotations

import pytest
import torch

from harness.policy.master_weights import MasterWeightsAdamW, needs_master_weights


def _model():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    return lin


def _steps(lin, opt, n):
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        lin(torch.ones(2, 8, dtype=torch.bfloat16)).sum().backward()
        opt.step()


def test_small_updates_accumulate_in_the_masters_not_in_bf16():
    """lr 1e-4 on weights of 1.0: below bf16's resolution there (2**-7), so plain bf16 AdamW never
    moves them; with fp32 masters 200 steps move them by ~0.02, visible in bf16."""
    plain = _model()
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-4, weight_decay=0.0)
    _steps(plain, opt, 200)
    assert torch.all(plain.weight == 1.0)
    lin = _model()
    opt = MasterWeightsAdamW(lin.parameters(), lr=1e-4, weight_decay=0.0)
    _steps(lin, opt, 200)
    assert opt.master[0].dtype == torch.float32 and opt.state[opt.master[0]]["exp_avg"].dtype == torch.float32
    assert torch.all(lin.weight < 1.0)
    assert torch.equal(lin.weight, opt.master[0].detach().to(torch.bfloat16))
    opt.zero_grad(set_to_none=True)
    assert lin.weight.grad is None and opt.master[0].grad is None


def test_state_dict_restores_masters_exactly_and_refuses_a_foreign_state():
    lin = _model()
    opt = MasterWeightsAdamW(lin.parameters(), lr=1e-3)
    _steps(lin, opt, 3)
    saved = opt.state_dict()
    _steps(lin, opt, 3)
    opt.load_state_dict(saved)
    assert torch.equal(opt.master[0], saved["master"][0])
    with pytest.raises(ValueError, match="not a MasterWeightsAdamW state"):
        opt.load_state_dict(torch.optim.AdamW(lin.parameters()).state_dict())


def test_only_low_precision_models_need_masters():
    assert needs_master_weights([torch.zeros(1, dtype=torch.bfloat16)])
    assert not needs_master_weights([torch.zeros(1)])
