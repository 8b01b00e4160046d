"""Sizes and rank offsets come from the planner's topology, computed once: the refit's
engine offsets are the topology's ``rank_prefix`` values and its side group spans
policy rank 0 plus every engine rank."""

from __future__ import annotations

import pytest

from harness.grpo.refit import Refitter
from harness.spec import load_spec, plan
from harness.spec.constraints import policy_world


def _spec(engines: int, tp: int):
    return load_spec("qwen3_moe_tiny_smoke", [f"rollout.engines={engines}", f"rollout.tp={tp}",
                                              "rollout.colocated=false", "rollout.async=true"])


@pytest.mark.parametrize("engines, tp", [(1, 1), (2, 2), (3, 1)])
def test_refit_offsets_are_the_topologys(engines, tp):
    spec = _spec(engines, tp)
    topology = plan(spec)
    refitter = Refitter(spec, None, [object()] * engines, run_dir=None, topology=topology)
    assert refitter.prefixes == [e.rank_prefix for e in topology.engines] == [i * tp for i in range(engines)]
    assert refitter.transport == "broadcast" and refitter._side_world == 1 + engines * tp
    assert Refitter(spec, None, [object()] * engines, run_dir=None).prefixes == refitter.prefixes  # plan(spec)


def test_a_worker_count_other_than_the_topologys_is_refused():
    spec = _spec(2, 1)
    with pytest.raises(ValueError, match="3 rollout workers for a topology of 2 engines"):
        Refitter(spec, None, [object()] * 3, run_dir=None, topology=plan(spec))


def test_the_world_size_is_computed_once():
    for name in ("qwen3_moe_tiny_tp2pp2cp2ep2", "qwen3_moe_tiny_dtensor", "qwen3_moe_tiny_smoke"):
        spec = load_spec(name)
        assert spec.policy.world_size == policy_world(spec) == plan(spec).policy.world
