"""Properties of the run plan (harness.spec.runplan, issue 42) on the smoke workload.

Layouts and overrides are drawn (tp sp pp cp ep etp dp, seq_len, max_new_tokens, seed):

* **plan arm** (hundreds of examples, no process started): ``build_plan`` either returns a
  plan or raises ``SpecError`` naming a field (a ``TopologyError`` also its rule), never
  anything else; ``golden plan`` gives the same decision (exit 0 / 2 and the field); and
  whatever the plan accepts passes the checks the runtime itself makes that can run without
  Ray: the workers' layout check (``parallel.groups.validate_policy_layout``), their stage
  split (``stage_layers``), the rank layout they build (``layout_from_topology``: one rank
  per coordinate), and every policy rank's torch seed (``seed * 1000 + rank`` given to a
  real ``torch.Generator``, what ``policy.seeding.seed_rank`` does);
* **run arm** (a few examples: each a real one-iteration CPU run of ``golden run``, ~10 s on
  2 cores): whatever the plan accepts completes (exit 0); whatever it refuses, ``golden
  run`` refuses with exit 2 naming the field, before a run directory is written.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.parallel.groups import layout_from_topology, stage_layers, validate_policy_layout
from harness.spec.errors import SpecError, TopologyError
from harness.spec.runplan import RunPlan, build_plan

SMOKE = "qwen3_moe_tiny_smoke"
SEEDS = st.one_of(st.integers(0, 10**6), st.integers(2**53, 2**80))


@st.composite
def overrides(draw, small: bool = False) -> list[str]:
    """Overrides of the smoke workload's layout and run values (``small``: worlds a 2-core box
    runs in ~10 s)."""
    sizes = (1, 2) if small else (1, 1, 2, 2, 3, 4)
    knobs = {
        "policy.tp": draw(st.sampled_from(sizes)),
        "policy.sp": draw(st.sampled_from((True, True, True, False))),  # weighted: most layouts with tp > 1 need it
        "policy.pp": draw(st.sampled_from((1, 2) if small else (1, 2, 3, 4))),
        "policy.cp": draw(st.sampled_from((1, 2))),
        "policy.ep": draw(st.sampled_from((1, 1, 2) if small else (1, 1, 2, 2, 3, 4, 8))),
        "policy.etp": draw(st.sampled_from((1, 1, 1, 2))),
        "policy.dp": draw(st.sampled_from((1,) if small else (1, 2, 4))),
        "policy.seq_len": draw(st.sampled_from((32, 64) if small else (8, 16, 32, 48, 64, 100))),
        "rollout.max_new_tokens": draw(st.sampled_from((8, 16, 64) if small else (1, 8, 16, 40, 64, 1000))),
        "seed": draw(st.integers(0, 10**6) if small else SEEDS),
    }
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in knobs.items()]


def _decide(ov: list[str]) -> RunPlan | SpecError:
    try:
        return build_plan(SMOKE, ov, platform="cpu", check_trace_settings=False)
    except SpecError as exc:
        return exc


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ov=overrides())
def test_what_the_plan_accepts_the_runtime_checks_accept(ov, capsys):
    decided = _decide(ov)
    code = main(["plan", SMOKE, *ov, "platform.device=cpu"])
    err = capsys.readouterr().err
    if isinstance(decided, SpecError):
        assert decided.field and decided.message
        if isinstance(decided, TopologyError):
            assert decided.rule
        assert code == 2 and f"{decided.field}:" in err
        return
    assert code == 0, err
    spec, topo = decided.workload, decided.topology
    validate_policy_layout(spec.policy, spec.model)  # the workers' own check: ValueError fails the property
    stages = stage_layers(spec.model.layers, spec.policy.pp, spec.policy.pp_layout)
    assert sum(len(s) for s in stages) == spec.model.layers and all(len(s) for s in stages)
    layout = layout_from_topology(topo, spec.policy)
    assert layout.world == spec.policy.world_size == topo.policy.world
    assert len({tuple(sorted(c.items())) for c in layout.coords}) == layout.world  # one rank per coordinate
    for rank in range(layout.world):
        torch.Generator().manual_seed(int(spec.seed) * 1000 + rank)  # RuntimeError (overflow) fails it
    assert spec.rollout.max_new_tokens < spec.policy.seq_len  # a sample always fits the trainer's sequence


@pytest.mark.slow
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ov=overrides(small=True))
def test_what_the_plan_accepts_runs_and_what_it_refuses_never_starts(ov, tmp_path_factory, capsys):
    run_dir = tmp_path_factory.mktemp("run") / "run"
    decided = _decide([*ov, "grpo.iterations=1"])
    code = main(["run", SMOKE, *ov, "grpo.iterations=1", "--platform", "cpu", "--run-dir", str(run_dir), "-q"])
    err = capsys.readouterr().err
    if isinstance(decided, SpecError):
        assert code == 2 and f"{decided.field}:" in err, err
        assert not (run_dir / "run.json").exists()
    else:
        assert code == 0, err[-3000:]
        assert (run_dir / "manifest.json").is_file()
