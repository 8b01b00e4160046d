"""The gate catches planted regressions, on the right surface, naming the rank.

A baseline run of the multi-turn workload (2 policy ranks TP2/EP2 with SP,
async rollout engine, capture and both profilers on; 2 iterations to keep it
short) is compared with runs that each carry one planted regression:

* collectives  an extra all-reduce in a tensor-parallel layer (worker hook)
* operators    an extra operator in the policy forward (worker hook)
* lifecycle    the trainer no longer opens the rollout profiler window
* rollouts     one token of the multi-turn retry prompt changed
* training     a changed loss coefficient (KL beta)
* topology     a changed expert-parallel layout

Each must produce findings on its surface, whose section and coordinates name
the affected rank. Worker-side mutations go through the runner's
``GOLDEN_WORKER_SETUP_HOOK`` (see ``harness.mutations``); driver-side ones are
applied with monkeypatch in this process, where the trainer runs.
"""

from __future__ import annotations

import contextlib

import pytest

from harness import flows
from harness.parity.engine import compare

WORKLOAD = "qwen3_moe_tiny_multiturn"
BASE = ("grpo.iterations=2",)

pytestmark = [pytest.mark.slow, pytest.mark.golden]


def _run(tmp_path_factory, name: str, overrides=()):
    execution = flows.execute(WORKLOAD, overrides=BASE + tuple(overrides),
                              run_dir=tmp_path_factory.mktemp(name) / "run")
    assert execution.ok, execution.problems()
    return execution


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return _run(tmp_path_factory, "baseline")


def _findings(baseline, mutated, surface):
    verdict = compare(flows.gated_only(baseline.postflight.surfaces), flows.gated_only(mutated.postflight.surfaces))
    assert not verdict.ok
    # "stale" (exact fail, inside a tolerance band) fails the gate too
    return [f for f in verdict.findings if f.surface == surface and f.status in ("fail", "stale")]


def test_extra_collective_in_tp_layer(baseline, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.extra_tp_collective")
    found = _findings(baseline, _run(tmp_path_factory, "collective"), "collectives")
    assert found
    ranks = {f.section for f in found}
    assert ranks == {"policy/rank00000", "policy/rank00001"}  # both TP ranks issue it
    assert all(f.coords is not None and "tp" in f.coords for f in found)
    assert any(f.phase == "train/step1" for f in found)


def test_extra_operator(baseline, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.extra_operator")
    mutated = _run(tmp_path_factory, "operator")
    found = _findings(baseline, mutated, "operators")
    assert found and all(f.section.startswith("policy/") and f.coords is not None for f in found)
    # numerically neutral: the loss curve is unchanged
    assert mutated.postflight.surfaces["training"] == baseline.postflight.surfaces["training"]


def test_missing_rollout_window(baseline, tmp_path_factory, monkeypatch):
    from harness.grpo.trainer import Trainer

    monkeypatch.setattr(Trainer, "rollout_window", lambda self, step_id: contextlib.nullcontext())
    found = _findings(baseline, _run(tmp_path_factory, "lifecycle"), "lifecycle")
    assert any(f.section == "rollout/rank00000" for f in found)


def test_one_changed_token_in_multiturn_rollout(baseline, tmp_path_factory, monkeypatch):
    import harness.envs.tool_env as tool_env

    monkeypatch.setattr(tool_env, "RETRY_PROMPT", tool_env.RETRY_PROMPT.replace("again", "agaim"))
    found = _findings(baseline, _run(tmp_path_factory, "rollouts"), "rollouts")
    assert found
    assert all(f.section.startswith("step000") and "-attempt1-row" in f.section for f in found)


def test_changed_loss_coefficient(baseline, tmp_path_factory):
    found = _findings(baseline, _run(tmp_path_factory, "training", ["grpo.loss.kl_beta=0.05"]), "training")
    # step 1 trains from the reference weights (KL 0); the coefficient shows from step 2
    assert any(f.section == "step0002" and f.key.endswith("loss") for f in found)


def test_changed_group_layout(baseline, tmp_path_factory):
    found = _findings(baseline, _run(tmp_path_factory, "topology", ["policy.ep=1"]), "topology")
    assert any(f.section == "policy" for f in found)
