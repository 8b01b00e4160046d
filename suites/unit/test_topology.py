"""Topology planner: the reference layouts A-D reproduce Megatron's group
tables exactly; placement, engines, helpers and the 235B job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.spec import TopologyError, coords_of, load_spec, plan, rank_groups
from harness.spec.params import estimate_params
from harness.spec.schema import fill_defaults
from harness.spec.topology import Grid

GOLDENS = Path(__file__).resolve().parents[2] / "goldens"
MODEL = {"layers": 4, "hidden": 64, "heads": 8, "kv_heads": 2, "head_dim": 16, "experts": 8,
         "top_k": 2, "moe_intermediate": 32, "vocab": 256}


def make_spec(policy: dict | None = None, rollout: dict | None = None, platform: dict | None = None,
              model: dict | None = None) -> dict:
    doc = {"name": "t", "model": {**MODEL, **(model or {})}, "policy": {"sp": True, **(policy or {})},
           "rollout": rollout or {}, "platform": {"gpus_per_node": 8, **(platform or {})}}
    return fill_defaults(doc)


def _layout(tp, pp, cp, dp, ep, etp):
    return plan(make_spec({"tp": tp, "pp": pp, "cp": cp, "dp": dp, "ep": ep, "etp": etp}))


# Expected layouts (Megatron's rank order).
def test_layout_a_tp2_pp2_cp2_ep2_etp1():
    g = _layout(2, 2, 2, 1, 2, 1).policy.groups
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["cp"] == g["dp_cp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g["ep"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["edp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_layout_b_etp2():
    """Megatron's expert grid with etp 2 (the rank layout alone: ``plan`` refuses etp > 1, which
    no policy backend implements)."""
    from harness.spec.topology import plan_policy_role

    spec = make_spec({"tp": 2, "pp": 2, "cp": 2, "dp": 1, "ep": 2, "etp": 2})
    with pytest.raises(TopologyError) as refused:
        plan(spec)
    assert refused.value.rule == "policy.etp == 1"
    role = plan_policy_role(spec, 8, 0)
    g = role.groups
    assert role.sizes["edp"] == 1
    assert g["etp"][0] == [0, 1]
    assert g["ep"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["tp_ep"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_layout_c_ep4():
    t = _layout(2, 2, 2, 1, 4, 1)
    assert t.policy.groups["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert t.policy.sizes["edp"] == 1


def test_layout_c_with_etp2_is_impossible():
    with pytest.raises(TopologyError) as info:
        _layout(2, 2, 2, 1, 4, 2)
    assert info.value.field == "policy.ep"


def test_layout_d_tp1_pp2_cp2_dp2_ep4():
    g = _layout(1, 2, 2, 2, 4, 1).policy.groups
    assert g["cp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["dp_cp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert g["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_megatron_rank_formula_and_expert_folding():
    t = _layout(2, 2, 2, 1, 2, 1)
    for info in t.policy.ranks:
        c = info.coords
        assert info.rank == c["tp"] + 2 * (c["cp"] + 2 * (c["dp"] + 1 * c["pp"]))
        assert info.rank == c["etp"] + 1 * (c["ep"] + 2 * (c["edp"] + 2 * c["pp"]))


def test_grid_refuses_ep_and_cp_together():
    with pytest.raises(TopologyError) as info:
        Grid((("tp", 1), ("cp", 2), ("ep", 2), ("dp", 1), ("pp", 1)))
    assert info.value.field == "policy.cp"
    assert Grid((("tp", 1), ("cp", 2), ("ep", 1))).size == 2


def test_235b_plan():
    t = plan(load_spec("nemo_rl_qwen3_235b", goldens_root=GOLDENS))
    p = t.policy
    assert p.world == 64 and t.rollout.world == 8
    assert p.sizes == {"tp": 2, "cp": 2, "dp": 4, "pp": 4, "ep": 16, "etp": 1, "edp": 1}
    assert [n.kind for n in t.nodes] == ["head"] + ["worker"] * 16 and len(t.nodes) == 17
    assert {r.node for r in p.ranks} == set(range(1, 17))  # nothing on the CPU head
    assert p.ranks[63].node == 16 and p.ranks[63].device == 3
    assert t.stage_layers == (23, 24, 24, 23) and sum(t.stage_layers) == 94
    assert t.local_experts == 8
    counts = {k: (len(v), len(v[0])) for k, v in p.groups.items()}
    assert counts["tp"] == (32, 2) and counts["pp"] == (16, 4) and counts["dp"] == (16, 4)
    assert counts["dp_cp"] == (8, 8) and counts["ep"] == (4, 16) and counts["edp"] == (64, 1)
    assert p.groups["ep"][0] == list(range(16))  # EP16 = every tp*cp*dp rank of stage 0
    assert [e.rank_prefix for e in t.engines] == [0] and t.engines[0].ranks == tuple(range(8))
    assert [(r.node, r.device) for r in t.rollout.ranks] == [(1 + i // 4, i % 4) for i in range(8)]
    assert t.devices_used == 64


def test_separate_rollout_placement_and_engine_prefixes():
    t = plan(make_spec({"tp": 2, "dp": 2, "ep": 2}, {"engines": 3, "tp": 2, "colocated": False},
                       {"nodes": 3, "gpus_per_node": 4, "head_node": True}))
    assert t.placement == "separate" and t.devices_used == 4 + 6
    assert [e.rank_prefix for e in t.engines] == [0, 2, 4]
    assert t.rollout.groups["tp"] == [[0, 1], [2, 3], [4, 5]]
    slots = [(r.node, r.device) for r in t.rollout.ranks]
    assert slots == [(2, 0), (2, 1), (2, 2), (2, 3), (3, 0), (3, 1)]  # after the policy's 4 devices
    assert coords_of(t, "rollout", 3) == {"engine": 1, "tp": 1, "pp": 0}


def test_colocated_rollout_shares_policy_devices():
    t = plan(make_spec({"tp": 2, "pp": 2, "cp": 2, "ep": 2}, {"tp": 2, "engines": 2}))
    for r in t.rollout.ranks:
        assert (r.node, r.device) == (t.policy.ranks[r.rank].node, t.policy.ranks[r.rank].device)
    with pytest.raises(TopologyError) as info:
        plan(make_spec({"tp": 2}, {"tp": 2, "engines": 2}))
    assert info.value.field == "rollout.engines"


def test_rank_groups_and_coords_helpers():
    t = _layout(2, 2, 2, 1, 2, 1)
    groups = rank_groups(t, 5)
    assert groups["tp"] == [4, 5] and groups["pp"] == [1, 5] and groups["ep"] == [4, 5] and groups["edp"] == [5, 7]
    assert coords_of(t, "policy", 5) == {"tp": 1, "cp": 0, "dp": 0, "pp": 1, "ep": 1, "etp": 0, "edp": 0}
    assert t.policy.group_index("tp", 5) == 2
    with pytest.raises(TopologyError) as info:
        rank_groups(t, 8)
    assert info.value.field == "policy.rank"
    with pytest.raises(TopologyError, match="unknown role 'trainer'") as info:
        coords_of(t, "trainer", 0)
    assert info.value.field == "role"


def test_uneven_pipeline_layout():
    spec = make_spec({"pp": 3, "pp_layout": [1, 1]}, model={"layers": 6})
    assert plan(spec).stage_layers == (1, 4, 1)
    with pytest.raises(TopologyError) as info:
        plan(make_spec({"pp": 4, "pp_layout": [2, 2]}, model={"layers": 5}))  # 1 layer for 2 middles
    assert info.value.field == "policy.pp_layout"
    with pytest.raises(TopologyError) as info:
        plan(make_spec({"pp": 1, "pp_layout": [2, 2]}))
    assert info.value.field == "policy.pp_layout"


def test_kv_head_replication_is_refused_as_the_policy_group_refuses_it():
    from harness.parallel.groups import validate_policy_layout
    from harness.spec.typed import as_workload

    spec = make_spec({"tp": 4}, model={"kv_heads": 2})  # tp % kv_heads == 0: replication, which no backend does
    with pytest.raises(TopologyError) as info:
        plan(spec)
    assert info.value.rule == "model.kv_heads % policy.tp == 0"
    typed = as_workload(spec)
    with pytest.raises(ValueError, match="no KV replication"):  # what the workers would say after Ray started
        validate_policy_layout(typed.policy, typed.model)
    with pytest.raises(TopologyError) as info:
        plan(make_spec({"tp": 4}, model={"heads": 12, "kv_heads": 6, "hidden": 96}))
    assert info.value.rule == "model.kv_heads % policy.tp == 0"


def test_to_dict_is_json_and_complete():
    t = plan(load_spec("qwen3_moe_tiny_tp2pp2cp2ep2", goldens_root=GOLDENS))
    doc = json.loads(json.dumps(t.to_dict()))
    assert doc["policy"]["world"] == 8 and len(doc["policy"]["ranks"]) == 8
    assert doc["policy"]["ranks"][3]["coords"] == {"tp": 1, "cp": 1, "dp": 0, "pp": 0, "ep": 1, "etp": 0, "edp": 1}
    assert doc["rollout"]["groups"]["tp"] == [[0, 1]]
    assert doc["engines"] == [{"engine": 0, "rank_prefix": 0, "ranks": [0, 1]}]
    assert doc["placement"] == "colocated" and doc["stage_layers"] == [2, 2]
    assert t.groups["policy"] is t.policy.groups and t.groups["rollout"]["engine"] == [[0, 1]]


def test_params_match_reference_counts():
    tiny = estimate_params(MODEL)
    assert (tiny["total"], tiny["active"]) == (314_048, 166_592)
    big = estimate_params(load_spec("nemo_rl_qwen3_235b", goldens_root=GOLDENS)["model"])
    assert (big["total"], big["active"]) == (235_093_634_560, 22_190_763_520)



def test_megatron_backend_on_cpu_and_context_parallel_needs_cuda():
    plan(make_spec({"backend": "megatron", "tp": 2}, platform={"device": "cpu"}))  # cpu is allowed (compat layer)
    with pytest.raises(
        TopologyError, match=r"policy\.cp=2 with policy\.backend: megatron needs Transformer Engine"
    ) as info:
        plan(make_spec({"backend": "megatron", "tp": 2, "cp": 2}, platform={"device": "cpu"}))
    assert info.value.field == "policy.cp"
    plan(make_spec({"backend": "native", "tp": 2, "cp": 2}))
    plan(make_spec({"backend": "megatron", "tp": 2, "cp": 2}, platform={"device": "cuda"}))
