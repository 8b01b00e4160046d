"""Hypothesis over random layouts: the planner is a bijection, its groups
partition the world with the declared sizes, and every constraint violation
is rejected with the right field (checked against an independent oracle)."""

from __future__ import annotations

from collections import Counter
from math import prod

from hypothesis import given
from hypothesis import strategies as st

from harness.spec import TopologyError, plan, rank_groups
from harness.spec.constraints import violations
from harness.spec.schema import fill_defaults
from harness.spec.topology import DENSE_GROUP_KINDS, EXPERT_GROUP_KINDS

SIZES = st.sampled_from([1, 2, 4])


@st.composite
def valid_specs(draw):
    tp, cp, dp, pp = draw(SIZES), draw(SIZES), draw(SIZES), draw(st.sampled_from([1, 2, 3]))
    stage = tp * cp * dp
    etp = 1  # the only expert tensor parallel size implemented (the grid's etp > 1: test_topology)
    ep = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16) if stage % (etp * d) == 0]))
    world = stage * pp
    gpn = draw(st.sampled_from([1, 2, 4, 8]))
    head = draw(st.booleans())
    rtp = draw(st.sampled_from([1, 2]))
    engines = draw(st.integers(1, 3))
    colocated = draw(st.booleans()) and engines * rtp <= world
    rworld = engines * rtp
    need = world + (0 if colocated else rworld)
    doc = {
        "name": "prop",
        "model": {"layers": pp * draw(st.integers(1, 3)), "hidden": 64, "heads": 16, "kv_heads": 4, "head_dim": 8,
                  "experts": ep * draw(st.integers(1, 3)), "top_k": 1, "moe_intermediate": 16, "vocab": 256},
        "policy": {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep, "etp": etp, "sp": True,
                   "seq_len": 2 * cp * tp * draw(st.integers(1, 4)), "micro_batch_size": 1},
        "grpo": {"prompts_per_step": dp, "generations_per_prompt": 4},
        "rollout": {"tp": rtp, "engines": engines, "colocated": colocated, "max_new_tokens": 1},
        "platform": {"gpus_per_node": gpn, "nodes": -(-need // gpn), "head_node": head},
    }
    return fill_defaults(doc)


@given(valid_specs())
def test_plan_is_a_bijection_and_groups_partition(spec):
    t = plan(spec)
    p = spec["policy"]
    world = p["tp"] * p["cp"] * p["dp"] * p["pp"]
    sizes = t.policy.sizes
    assert t.policy.world == world == len(t.policy.ranks)
    assert sizes["etp"] * sizes["ep"] * sizes["edp"] * sizes["pp"] == world
    dense_seen, expert_seen = set(), set()
    for info in t.policy.ranks:
        c = info.coords
        # Megatron mixed-radix order tp-cp-ep-dp-pp on both grids
        assert info.rank == c["tp"] + p["tp"] * (c["cp"] + p["cp"] * (c["dp"] + p["dp"] * c["pp"]))
        assert info.rank == c["etp"] + p["etp"] * (c["ep"] + p["ep"] * (c["edp"] + sizes["edp"] * c["pp"]))
        dense_seen.add((c["tp"], c["cp"], c["dp"], c["pp"]))
        expert_seen.add((c["etp"], c["ep"], c["edp"], c["pp"]))
        assert all(0 <= c[k] < sizes[k] for k in c)
        slot_node = (1 if spec["platform"]["head_node"] else 0) + info.rank // spec["platform"]["gpus_per_node"]
        assert (info.node, info.device) == (slot_node, info.rank % spec["platform"]["gpus_per_node"])
    assert len(dense_seen) == len(expert_seen) == world  # injective, hence bijective
    for kind, dims in {**DENSE_GROUP_KINDS, **EXPERT_GROUP_KINDS}.items():
        groups = t.policy.groups[kind]
        flat = [r for g in groups for r in g]
        assert sorted(flat) == list(range(world)), kind  # a partition
        assert {len(g) for g in groups} == {prod(sizes[d] for d in dims)}, kind
        assert all(g == sorted(g) for g in groups) and [g[0] for g in groups] == sorted(g[0] for g in groups)
        for g in groups:  # members differ only in the kind's own coordinates
            fixed = [k for k in ("tp", "cp", "dp", "pp", "etp", "ep", "edp")
                     if k not in dims and not (kind in EXPERT_GROUP_KINDS and k in ("tp", "cp", "dp"))
                     and not (kind in DENSE_GROUP_KINDS and k in ("etp", "ep", "edp"))]
            assert len({tuple(t.policy.ranks[r].coords[k] for k in fixed) for r in g}) == 1, kind
    for rank in range(world):
        assert all(rank in members for members in rank_groups(t, rank).values())
    r = spec["rollout"]
    assert t.rollout.world == r["engines"] * r["tp"]
    assert sorted(x for g in t.rollout.groups["tp"] for x in g) == list(range(t.rollout.world))
    assert [e.rank_prefix for e in t.engines] == [i * r["tp"] for i in range(r["engines"])]
    slots = {(x.node, x.device) for x in t.rollout.ranks}
    policy_slots = {(x.node, x.device) for x in t.policy.ranks}
    assert (slots <= policy_slots) if r["colocated"] else not (slots & policy_slots)


def oracle(spec) -> Counter:
    """Fields that must be reported, written independently of constraints.py
    (one entry per broken rule; several rules can blame the same field)."""
    m, p, r = spec["model"], spec["policy"], spec["rollout"]
    stage = p["tp"] * p["cp"] * p["dp"]
    world = stage * p["pp"]

    def splits(n, k):  # n can be sharded over k
        return n % k == 0

    def shards_or_replicates(kv, k):
        return kv % k == 0 or k % kv == 0

    seq_div = (2 * p["cp"] if p["cp"] > 1 else 1) * p["tp"]
    checks = [
        ("policy.ep", splits(m["experts"], p["ep"])),
        ("policy.etp", splits(stage, p["etp"])),
        ("policy.etp", p["etp"] == 1),
        ("policy.ep", splits(stage, p["etp"] * p["ep"])),
        ("policy.tp", splits(m["heads"], p["tp"])),
        ("policy.tp", splits(m["kv_heads"], p["tp"])),  # no KV replication in the policy
        ("policy.tp", splits(m["hidden"], p["tp"])),
        ("policy.tp", splits(m["vocab"], p["tp"])),
        ("policy.etp", splits(m["moe_intermediate"], p["etp"])),
        ("policy.sp", p["tp"] == 1 or p["sp"]),
        ("policy.pp", splits(m["layers"], p["pp"])),
        ("policy.seq_len", splits(p["seq_len"], seq_div)),
        ("policy.seq_len", p["seq_len"] <= m["max_position"]),
        ("rollout.max_new_tokens", r["max_new_tokens"] < p["seq_len"]),
        ("seed", spec["seed"] * 1000 + world < 2**63),
        ("rollout.pp", r["pp"] == 1),  # any_specs always sets a rollout profiler
        ("rollout.ep", r["ep"] == 1),
        ("rollout.ep", splits(m["experts"], r["ep"])),
        ("rollout.tp", splits(m["heads"], r["tp"])),
        ("rollout.tp", shards_or_replicates(m["kv_heads"], r["tp"])),
        ("rollout.tp", splits(m["vocab"], r["tp"]) and splits(m["hidden"], r["tp"])),
        ("rollout.engines", r["tp"] * r["pp"] <= world),
        ("platform.nodes", world <= spec["platform"]["nodes"] * spec["platform"]["gpus_per_node"]),
    ]
    return Counter(field for field, ok in checks if not ok)


@st.composite
def any_specs(draw):
    small = st.integers(1, 6)
    doc = {
        "name": "prop",
        "model": {"layers": draw(st.integers(1, 8)), "hidden": draw(st.sampled_from([48, 64, 96])),
                  "heads": draw(st.sampled_from([4, 6, 8])), "kv_heads": 2, "head_dim": 8,
                  "experts": draw(st.integers(2, 12)), "top_k": 2, "moe_intermediate": 48, "vocab": 240},
        "policy": {"tp": draw(small), "cp": draw(small), "dp": draw(st.integers(1, 3)), "pp": draw(st.integers(1, 4)),
                   "ep": draw(st.one_of(st.just(1), small)), "etp": draw(st.sampled_from([1, 2, 3])),
                   "sp": draw(st.booleans()),
                   "seq_len": draw(st.one_of(st.sampled_from([48, 96]), st.integers(2, 96))), "micro_batch_size": 1},
        "grpo": {"prompts_per_step": 48, "generations_per_prompt": 3},
        "rollout": {"tp": draw(st.integers(1, 4)), "pp": draw(st.sampled_from([1, 1, 2])),
                    "ep": draw(st.sampled_from([1, 1, 2]))},
        "plugins": {"rollout_profiler": "harness.profiler.trace.TraceRolloutProfiler"},
        "platform": {"nodes": draw(st.integers(1, 4)), "gpus_per_node": 16},
    }
    return fill_defaults(doc)


@given(any_specs())
def test_every_violation_is_reported_with_its_field(spec):
    expected = oracle(spec)
    got = Counter(v.field for v in violations(spec))
    assert got == expected
    try:
        plan(spec)
    except TopologyError as exc:
        assert expected, f"rejected a valid layout: {exc}"
        assert exc.field in expected and exc.field in str(exc) and exc.rule in str(exc)
    else:
        assert not expected


def test_a_1024_rank_layout_plans():
    spec = fill_defaults({
        "name": "big", "model": {"layers": 96, "hidden": 4096, "heads": 64, "kv_heads": 8, "head_dim": 128,
                                  "experts": 256, "top_k": 8, "moe_intermediate": 2048, "vocab": 151936,
                                  "max_position": 40960},
        "policy": {"tp": 8, "cp": 2, "dp": 8, "pp": 8, "ep": 64, "etp": 1, "sp": True, "seq_len": 8192,
                   "micro_batch_size": 1},
        "grpo": {"prompts_per_step": 64, "generations_per_prompt": 16},
        "platform": {"nodes": 128, "gpus_per_node": 8, "device": "cuda"},
    })
    t = plan(spec)
    assert t.policy.world == 1024 and t.policy.sizes["edp"] == 2
    assert len(t.policy.groups["ep"]) == 16 and len(t.policy.groups["ep"][0]) == 64
