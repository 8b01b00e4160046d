"""Rank layout, zig-zag chunks, stage split and layout validation (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.model.config import ModelConfig
from harness.parallel.context import gathered_positions, zigzag_positions
from harness.parallel.groups import layout_from_spec, stage_layers, validate_policy_layout
from harness.spec.typed import as_workload

REPO = Path(__file__).resolve().parents[2]
MODEL = as_workload({"model": {**ModelConfig().to_dict(), "experts": 8, "heads": 8, "kv_heads": 2, "vocab": 256,
                                "layers": 4}}).model


def _policy(**kw):
    p = dict(tp=1, pp=1, cp=1, ep=1, etp=1, dp=1, sp=True, seq_len=64, pp_layout=None)
    p.update(kw)
    return as_workload({"policy": p}).policy


def test_layout_a_matches_megatron_groups():
    g = layout_from_spec(_policy(tp=2, pp=2, cp=2, ep=2)).groups
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["dp_cp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g["ep"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["edp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_layout_d_ep_across_cp_and_dp():
    g = layout_from_spec(_policy(pp=2, cp=2, dp=2, ep=4)).groups
    assert g["dp_cp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert g["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_planner_and_local_rule_agree():
    from harness.parallel.groups import layout_from_topology
    from harness.spec import load_spec, plan

    spec = load_spec(str(REPO / "goldens/qwen3_moe_tiny_tp2pp2cp2ep2/workload.yaml"))
    local = layout_from_topology(plan(spec), spec.policy)  # raises on disagreement
    assert local.world == 8


def test_zigzag_chunks_cover_sequence_once():
    for cp in (1, 2, 4):
        pos = gathered_positions(64, cp)
        assert sorted(pos.tolist()) == list(range(64))
    assert zigzag_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert zigzag_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


def test_stage_layers_even_and_uneven():
    assert [list(r) for r in stage_layers(4, 2, None)] == [[0, 1], [2, 3]]
    assert [len(r) for r in stage_layers(4, 2, [1, 3])] == [1, 3]
    assert [len(r) for r in stage_layers(8, 4, [1, 1])] == [1, 3, 3, 1]
    with pytest.raises(ValueError, match="policy.pp_layout"):
        stage_layers(4, 2, [1, 1])
    with pytest.raises(ValueError, match="policy.pp"):
        stage_layers(5, 2, None)


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(etp=2, tp=2), "policy.etp"),
        (dict(tp=4), "model.kv_heads"),
        (dict(ep=3, dp=3), "policy.ep"),
        (dict(tp=2, sp=False), "policy.sp"),
        (dict(cp=2, tp=2, seq_len=20), "policy.seq_len"),
        (dict(ep=2), "policy.ep"),
    ],
)
def test_validate_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        validate_policy_layout(_policy(**kw), MODEL)


def test_vocab_parallel_logprobs_single_rank_equals_log_softmax():
    from harness.parallel.tensor import vocab_parallel_logprobs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g, requires_grad=True)
    t = torch.randint(0, 11, (2, 5), generator=g)
    lp = vocab_parallel_logprobs(logits, t, 0, None)
    ref = torch.log_softmax(logits, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(lp, ref)
    (ga,) = torch.autograd.grad(lp.sum(), logits)
    (gb,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(ga, gb)
