"""Operator-inventory step schedule (HARNESS_TRACE_OPERATOR_STEPS) and the spec's plugin env."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import strategies as st

from harness.artifacts.layout import policy_trace_path, rollout_trace_path
from harness.artifacts.trace import read_trace
from harness.plugins.loader import load_policy_profiler, load_rollout_profiler
from harness.plugins.policy_hooks import PolicyProfilerHooks
from harness.plugins.rollout_hooks import RolloutProfilerHooks
from harness.profiler.phase import OPERATOR_STEPS_ENV, parse_step_schedule
from harness.profiler.trace import rollout_step_number
from suites.tiny_train import tiny_train
from suites.torch_state import torch_settings

POLICY = "harness.profiler.trace.TracePolicyProfiler"
ROLLOUT = "harness.profiler.trace.TraceRolloutProfiler"


@pytest.mark.parametrize("raw", ["", "  ", "all", "ALL"])
def test_every_step_by_default(raw):
    assert parse_step_schedule(raw) is None


def test_schedule_items_combine():
    schedule = parse_step_schedule("2, 5-6, every:10")
    chosen = [s for s in range(1, 25) if schedule.selects(s)]
    assert chosen == [1, 2, 5, 6, 11, 21]
    assert schedule.selects(None)  # a phase without a step (engine_init) is always counted


@pytest.mark.parametrize("raw", ["0", "-1", "x", "3-1", "every:0", "every:x", "every:2,every:3", "1,,2", "1-"])
def test_bad_schedule_names_the_variable_and_item(raw):
    with pytest.raises(ValueError, match=OPERATOR_STEPS_ENV) as info:
        parse_step_schedule(raw)
    assert "item" in str(info.value)


@given(steps=st.sets(st.integers(1, 60), max_size=8), every=st.integers(0, 7))
def test_schedule_selects_exactly_what_it_names(steps, every):
    items = [str(s) for s in sorted(steps)] + ([f"every:{every}"] if every else [])
    if not items:
        return
    schedule = parse_step_schedule(",".join(items))
    for step in range(1, 80):
        expected = step in steps or (every > 0 and (step - 1) % every == 0)
        assert schedule.selects(step) == expected


@pytest.mark.parametrize(("step_id", "step"), [
    (3, 3), ("step3/attempt1", 3), ("step12/attempt2", 12), ("step7", 7), ("warmup", None), ("steps/1", None),
])
def test_rollout_step_number(step_id, step):
    assert rollout_step_number(step_id) == step


def test_policy_phases_outside_the_schedule_have_no_inventory(tmp_path, monkeypatch):
    with torch_settings(threads=1):
        _policy_phases_outside_the_schedule(tmp_path, monkeypatch)


def _policy_phases_outside_the_schedule(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv(OPERATOR_STEPS_ENV, "every:2")
    hooks = PolicyProfilerHooks(load_policy_profiler(rank=0, environ={"NRL_POLICY_PROFILER_CLASS": POLICY}))
    for _ in range(3):
        hooks.run_train(tiny_train, torch.ones(4, 8))
    hooks.close()
    trace = read_trace(tmp_path / policy_trace_path(0))
    assert trace.complete, trace.problems
    assert trace.header["operator_steps"] == "every:2"
    step1, step2, step3 = trace.of_type("phase")
    assert step1["operators"] == step3["operators"] and step1["operators"]["aten::mm"] >= 1
    assert "operators_skipped" not in step1 and "operators_skipped" not in step3
    assert step2["operators"] is None and step2["operators_skipped"] == "every:2"
    assert step2["collectives"] == [] and step2["memory"]["peak_rss"] > 0  # the rest is still observed


def test_rollout_schedule_uses_the_grpo_step_and_always_counts_engine_init(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv(OPERATOR_STEPS_ENV, "2")
    hooks = RolloutProfilerHooks(load_rollout_profiler(rank=0, environ={"NRL_ROLLOUT_PROFILER_CLASS": ROLLOUT}))
    with hooks.engine_init():
        torch.zeros(4).add_(1)
    for step_id in ("step1/attempt1", "step2/attempt1", "step2/attempt2"):
        with hooks.rollout(step_id):
            torch.ones(3).softmax(0)
    hooks.close()
    phases = {p["phase"]: p for p in read_trace(tmp_path / rollout_trace_path(0)).of_type("phase")}
    assert "aten::add_" in phases["engine_init"]["operators"]
    assert phases["rollout/step1/attempt1"]["operators"] is None
    assert phases["rollout/step2/attempt1"]["operators"] == phases["rollout/step2/attempt2"]["operators"]
    assert "aten::_softmax" in phases["rollout/step2/attempt1"]["operators"]


def test_bad_schedule_fails_worker_start(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv(OPERATOR_STEPS_ENV, "every:0")
    with pytest.raises(RuntimeError, match="Failed to initialize policy profiler") as info:
        load_policy_profiler(rank=0, environ={"NRL_POLICY_PROFILER_CLASS": POLICY})
    assert OPERATOR_STEPS_ENV in str(info.value.__cause__)


def _spec_with_env(tmp_path, env):
    from harness.spec import load_spec

    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "goldens" / "qwen3_moe_tiny_smoke" / "workload.yaml").read_text())
    doc.setdefault("plugins", {})["env"] = env
    path = tmp_path / "workload.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_spec(str(path), [])


def test_spec_plugin_env_reaches_every_worker(tmp_path):
    from harness.runner.run import worker_env

    spec = _spec_with_env(tmp_path, {OPERATOR_STEPS_ENV: "1"})
    env = worker_env(spec, tmp_path / "run", "rid")
    assert env[OPERATOR_STEPS_ENV] == "1" and env["HARNESS_TRACE_DIR"] == str(tmp_path / "run")


@pytest.mark.parametrize(("env", "needle"), [
    ({"HARNESS_TRACE_DIR": "/elsewhere"}, "HARNESS_TRACE_DIR"),
    ({"NRL_POLICY_PROFILER_CLASS": "a.B"}, "NRL_POLICY_PROFILER_CLASS"),
    ({"lower_case": "1"}, "lower_case"),
    ({OPERATOR_STEPS_ENV: 1}, f"plugins.env.{OPERATOR_STEPS_ENV}"),
])
def test_spec_plugin_env_rejects_reserved_and_malformed_keys(tmp_path, env, needle):
    from harness.spec.errors import SpecError

    with pytest.raises(SpecError, match="plugins.env") as info:
        _spec_with_env(tmp_path, env)
    assert needle in str(info.value)
