"""The gate catches planted regressions, on the right surface, naming the rank.

A baseline run of the multi-turn workload (2 policy ranks TP2/EP2 with SP,
rollout engine, capture and both profilers on) is compared with runs that
each carry one planted regression. Every run here is compared with the baseline,
never with the stored golden, so all of them use a cheaper configuration of the
same workload (``BASE``: 2 iterations, 2 prompts x 2 generations, 2 turns, 8 new
tokens a turn, the 4 samples in one micro-batch, the engine in the rollout actor
instead of an internal engine process: about 0.3 of the run): what each test needs is still there (steps 1
and 2, the retry prompt of a wrong first answer, both TP ranks, EP2, a step-2
generation batch), and each test fails with its mutation removed.

* collectives  an extra all-reduce in a tensor-parallel layer (worker hook)
* operators    an extra operator in the policy forward (worker hook)
* lifecycle    the trainer no longer opens the rollout profiler window
* rollouts     one token of the multi-turn retry prompt changed
* training     a changed loss coefficient (KL beta)
* topology     a changed expert-parallel layout

Each must produce findings on its surface, whose section and coordinates name
the affected rank. Four of them (a debug barrier in the DP path, one extra
all-gather on one TP rank, one changed sampled token in step 2, a changed EP
layout) must also come out as exactly one cause on top of the first-divergence
list (harness.parity.divergence), naming rank, step and position, with every
other gated finding grouped under it; the barrier's HTML report shows it first in
headless Chromium (a screenshot is taken; the DOM it rendered is checked). Worker-side mutations go through the runner's
``GOLDEN_WORKER_SETUP_HOOK`` (see ``harness.mutations``); driver-side ones are
applied with monkeypatch in this process, where the trainer runs.

Every run goes through the ``golden`` fixture's warm runtime (docs/runner.md):
the baseline and the driver-side mutations in pooled processes, each worker
hook in pooled processes that run it before adopting the workload and undo it
after (``WarmRuntime.release``); ``GOLDEN_WARM=0`` runs them all cold. The last
test runs the baseline again, clean, in the processes that ran every mutation
above, and requires its gated surfaces byte-identical to the baseline's.
"""

from __future__ import annotations

import contextlib

import pytest

from harness import flows
from harness.parity.comparison import compare

WORKLOAD = "qwen3_moe_tiny_multiturn"
# The mutated runs are compared with a baseline of this same configuration, not with the golden.
BASE = ("grpo.iterations=2", "grpo.prompts_per_step=2", "grpo.generations_per_prompt=2", "env.turns=2",
        "rollout.max_new_tokens=8", "policy.micro_batch_size=4", "rollout.async=false")

# --golden-since: the mutation runs are a cheaper multiturn configuration (a sync engine in the rollout
# actor, as smoke's), so they run when either workload is affected, or the mutations changed.
pytestmark = [pytest.mark.slow, pytest.mark.golden,
              pytest.mark.golden_uses(WORKLOAD, "qwen3_moe_tiny_smoke", files=("harness/mutations.py",))]


class PidRecorder:
    """A progress sink that keeps the workers' pids (``Session._detail``)."""

    def __init__(self) -> None:
        self.pids: dict[str, set[int]] = {}

    def __call__(self, text: str) -> None:
        pass

    def detail(self, what: str, records: list[dict]) -> None:
        self.pids[what] = {r.get("pid", r.get("actor_pid")) for r in records}


def _run(golden, tmp_path_factory, name: str, overrides=(), say=None):
    execution = flows.execute(WORKLOAD, overrides=BASE + tuple(overrides), say=say,
                              run_dir=tmp_path_factory.mktemp(name) / "run", warm=golden.warm_runtime())
    assert execution.ok, execution.problems()
    return execution


@pytest.fixture(scope="module")
def baseline(golden, tmp_path_factory):
    rec = PidRecorder()
    execution = _run(golden, tmp_path_factory, "baseline", say=rec)
    execution.pids = rec.pids
    return execution


def _verdict(baseline, mutated):
    return compare(flows.gated_only(baseline.postflight.surfaces), flows.gated_only(mutated.postflight.surfaces))


def _one_cause(verdict):
    """The single cause, after checking that every gated finding is it or grouped under it."""
    assert not verdict.ok
    gated = [f for f in verdict.findings if f.status in ("fail", "stale")]
    assert len(verdict.divergences) == 1, [(d.cause.surface, d.cause.section, d.cause.phase, d.cause.key)
                                           for d in verdict.divergences]
    (cause,) = verdict.divergences
    assert 1 + len(cause.consequences) == len(gated)
    return cause


@pytest.fixture(scope="module")
def barrier_run(golden, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.dp_debug_barrier")
        return _run(golden, tmp_path_factory, "barrier")


def _findings(baseline, mutated, surface):
    verdict = compare(flows.gated_only(baseline.postflight.surfaces), flows.gated_only(mutated.postflight.surfaces))
    assert not verdict.ok
    # "stale" (exact fail, inside a tolerance band) fails the gate too
    return [f for f in verdict.findings if f.surface == surface and f.status in ("fail", "stale")]


def test_extra_collective_in_tp_layer(golden, baseline, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.extra_tp_collective")
    found = _findings(baseline, _run(golden, tmp_path_factory, "collective"), "collectives")
    assert found
    ranks = {f.section for f in found}
    assert ranks == {"policy/rank00000", "policy/rank00001"}  # both TP ranks issue it
    assert all(f.coords is not None and "tp" in f.coords for f in found)
    assert any(f.phase == "train/step1" for f in found)


def test_extra_operator(golden, baseline, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.extra_operator")
    mutated = _run(golden, tmp_path_factory, "operator")
    found = _findings(baseline, mutated, "operators")
    assert found and all(f.section.startswith("policy/") and f.coords is not None for f in found)
    # numerically neutral: the loss curve is unchanged
    assert mutated.postflight.surfaces["training"] == baseline.postflight.surfaces["training"]


def test_missing_rollout_window(golden, baseline, tmp_path_factory, monkeypatch):
    from harness.grpo.trainer import Trainer

    monkeypatch.setattr(Trainer, "rollout_window", lambda self, step_id: contextlib.nullcontext())
    found = _findings(baseline, _run(golden, tmp_path_factory, "lifecycle"), "lifecycle")
    assert any(f.section == "rollout/rank00000" for f in found)


def test_one_changed_token_in_multiturn_rollout(golden, baseline, tmp_path_factory, monkeypatch):
    import harness.envs.tool_env as tool_env

    monkeypatch.setattr(tool_env, "RETRY_PROMPT", tool_env.RETRY_PROMPT.replace("again", "agaim"))
    found = _findings(baseline, _run(golden, tmp_path_factory, "rollouts"), "rollouts")
    assert found
    assert all(f.section.startswith("step000") and "-attempt1-row" in f.section for f in found)


def test_changed_loss_coefficient(golden, baseline, tmp_path_factory):
    found = _findings(baseline, _run(golden, tmp_path_factory, "training", ["grpo.loss.kl_beta=0.05"]), "training")
    # step 1 trains from the reference weights (KL 0); the coefficient shows from step 2
    assert any(f.section == "step0002" and f.key.endswith("loss") for f in found)




# The two tests of the barrier run stay on one pytest-xdist worker (``-n 2``), so it runs once.
BARRIER_GROUP = pytest.mark.xdist_group("mutations-barrier-run")


@BARRIER_GROUP
def test_debug_barrier_in_dp_path_is_one_inserted_collective(baseline, barrier_run):
    cause = _one_cause(_verdict(baseline, barrier_run))
    f = cause.cause
    assert (f.surface, f.section, f.phase, f.kind) == ("collectives", "policy/rank00000", "train/step1", "added")
    assert f.actual[0] == "barrier" and f.golden == "<absent>"
    pos = f.position
    assert isinstance(pos["actual"], int) and pos["golden_at"] == pos["actual"] and pos["before"] and pos["after"]
    assert f.key == f"/collectives/{pos['actual']}"
    # the same insertion on the other rank and in step 2, nothing reported as "changed"
    repeats = [c for rule, c in cause.consequences if rule == "same change"]
    assert {(c.section, c.phase) for c in repeats} == {
        ("policy/rank00001", "train/step1"), ("policy/rank00000", "train/step2"), ("policy/rank00001", "train/step2")}
    assert all(c.kind == "added" for _, c in cause.consequences if c.surface == "collectives")


def test_extra_all_gather_on_one_tp_rank_is_one_cause(golden, baseline, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.extra_all_gather_on_tp_rank1")
    cause = _one_cause(_verdict(baseline, _run(golden, tmp_path_factory, "allgather")))
    f = cause.cause
    assert (f.surface, f.section, f.phase, f.kind) == ("collectives", "policy/rank00001", "train/step1", "added")
    assert f.actual[:2] == ["all_gather_into_tensor", "debug"] and f.coords["tp"] == 1
    assert isinstance(f.position["actual"], int)
    assert not [c for _, c in cause.consequences if c.section == "policy/rank00000"]   # rank 0 is unchanged


def test_changed_sampled_token_in_step2_is_one_cause(golden, baseline, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.rollout_token_changed_in_step2")
    verdict = _verdict(baseline, _run(golden, tmp_path_factory, "token"))
    cause = _one_cause(verdict)
    f = cause.cause
    assert f.surface == "rollouts" and f.section.startswith("step0002-attempt1-row"), f
    assert f.key.startswith("/calls/0") and f.position is not None and f.position["golden"] == 0
    # the EP all-to-all split sizes and the step's metrics follow the data: grouped, not on top
    follow = {c.surface for rule, c in cause.consequences if rule == "follows the data"}
    assert "training" in follow
    assert all(c.fields == ("numel",) for _, c in cause.consequences if c.surface == "collectives")


def test_changed_ep_layout_is_one_topology_cause(golden, baseline, tmp_path_factory):
    verdict = _verdict(baseline, _run(golden, tmp_path_factory, "topology", ["policy.ep=1"]))
    assert any(f.section == "policy" for f in verdict.findings if f.surface == "topology")
    cause = _one_cause(verdict)
    f = cause.cause
    assert (f.surface, f.section, f.key) == ("topology", "policy", "/layout/ep")
    assert (f.golden, f.actual) == (2, 1)
    assert {rule for rule, _ in cause.consequences} == {"after topology"}
    # coordinates are the run's, with the golden's where they differ (rank 1: ep=0 in the run, ep=1 before)
    rank1 = [c for _, c in cause.consequences if c.section == "policy/rank00001" and c.coords is not None]
    assert rank1 and all(c.coords["ep"] == 0 and c.golden_coords["ep"] == 1 for c in rank1)


@BARRIER_GROUP
def test_barrier_is_the_first_finding_in_the_html_report(baseline, barrier_run, tmp_path):
    from harness.parity.render import render_html
    from suites.browser import render_in_chromium

    verdict = _verdict(baseline, barrier_run)
    page = tmp_path / "report.html"
    page.write_text(render_html(verdict, title="barrier", provenance={"commit": "abc", "reason": "t"},
                                run={"run_id": "r1"}))
    png, dom = render_in_chromium(page, tmp_path)
    assert png.stat().st_size > 10_000
    first = dom.split('<li class="cause', 1)[1].split("</li>", 1)[0]
    assert 'data-surface="collectives"' in first and 'data-kind="added"' in first and "barrier" in first
    assert 'data-section="policy/rank00000"' in first and 'data-phase="train/step1"' in first
    assert dom.index('id="causes"') < dom.index('id="maps"') < dom.index('id="findings"')


def test_a_clean_run_after_the_mutations_equals_the_baseline(golden, baseline, tmp_path_factory):
    runtime = golden.warm_runtime()
    rec = PidRecorder()
    again = _run(golden, tmp_path_factory, "baseline-again", say=rec)
    stats = runtime.stats() if runtime is not None else {}
    if runtime is not None:
        assert rec.pids == baseline.pids, "the re-run is not in the baseline's processes"
    moved = [s for s in flows.gated_only(baseline.postflight.surfaces)
             if (again.run_dir / "surfaces" / f"{s}.json").read_bytes()
             != (baseline.run_dir / "surfaces" / f"{s}.json").read_bytes()]
    assert not moved, f"gated surfaces {moved} moved after the mutations ran in these processes ({stats})"
