"""Workers receive the run plan as values (issue 42; docs/spec.md, "The run plan").

Read from the source with ``ast`` (nothing imported): outside ``harness/spec/`` no module
converts a spec again (``as_workload``) except the few listed, each with its reason, and none
plans a layout (``harness.spec.topology.plan``). And the plan, with its teacher, pickles as it is
(Ray actor arguments, engine processes, the zygote).
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

from harness.spec.runplan import build_plan

HARNESS = Path(__file__).resolve().parents[2] / "harness"

# module -> why it still converts a spec (a plain dict reaches it, or another change owns it)
AS_WORKLOAD_LEFT = {
    "harness/runner/run.py": "run_workload: a dict spec of a test",
    "harness/postflight/run.py": "run.json's stored spec dict",
    "harness/policy/synthetic.py": "a test and bench helper called with dicts",
    "harness/policy/megatron/engine.py": "check_layout: called by a test with a dict",
    "harness/rollout/engine_worker.py": "initial_weights: tests and benches pass dicts",
    "harness/rollout/vllm/config.py": "the vLLM backend hands its engine processes a plain spec dict",
    "harness/rollout/vllm/llm.py": "the vLLM backend (as above)",
    "harness/rollout/vllm/start.py": "the vLLM backend (as above)",
    "harness/rollout/vllm/engine.py": "the vLLM backend (as above)",
    "harness/rollout/sglang/worker.py": "the SGLang backend's engine worker (not reworked here; cuda only)",
    "harness/policy/worker.py": "PolicyWorkerImpl: an identity on the plan's Workload (another change's file)",
    "harness/grpo/refitter.py": "Refitter: an identity on the plan's Workload (another change's file)",
}
# module -> why it may still plan a layout (only when no topology is passed: never on a run's path)
PLAN_LEFT = {"harness/grpo/refitter.py": "Refitter's fallback for tests (another change's file)"}


def _calls_outside_spec() -> tuple[dict[str, int], list[str]]:
    conversions: dict[str, int] = {}
    planners: list[str] = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS.parent).as_posix()
        if rel.startswith("harness/spec/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name == "as_workload":
                    conversions[rel] = conversions.get(rel, 0) + 1
            if (isinstance(node, ast.ImportFrom) and node.module == "harness.spec.topology"
                    and any(a.name == "plan" for a in node.names)):
                planners.append(rel)
    return conversions, planners


def test_no_worker_converts_the_spec_again_and_nothing_outside_spec_plans_the_layout():
    conversions, planners = _calls_outside_spec()
    unexpected = sorted(set(conversions) - set(AS_WORKLOAD_LEFT))
    assert unexpected == [], f"as_workload outside spec/ in {unexpected}: pass the plan's Workload down instead"
    unplanned = sorted(set(planners) - set(PLAN_LEFT))
    assert unplanned == [], f"a layout planned outside spec/ in {unplanned}: the plan's topology is passed down"


def test_the_plan_and_its_teacher_pickle_as_they_are():
    run_plan = build_plan("qwen3_moe_tiny_distill", options=["collective_timeout_s=60"], runnable=False)
    assert run_plan.teacher is not None and run_plan.teacher.policy.backend == "native"
    back = pickle.loads(pickle.dumps(run_plan))
    assert back == run_plan and back.teacher == run_plan.teacher and back.options.collective_timeout_s == 60.0
    assert build_plan("qwen3_moe_tiny_smoke", runnable=False).teacher is None
