"""Spec values a worker would refuse are refused up front (issue 16): exit 2, before Ray starts.

Each case once passed every up-front check and failed inside a worker (or the run's
driver) after Ray started: exit 3 after ~14 s. Here `golden run` must answer 2 with the
field named, leave no run.json (run_workload never started) and, in a subprocess, never
import ray.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.plugins.probe import static_probe
from harness.plugins.protocols import POLICY_PROFILER_METHODS

REPO = Path(__file__).resolve().parents[2]
W = "qwen3_moe_tiny_smoke"

CASES = {
    "moe_intermediate": (["rollout.tp=2", "rollout.colocated=false", "model.moe_intermediate=33"],
                         "rollout.tp: moe_intermediate=33"),
    "task": (["env.task=nosuch"], "env.task: unknown task 'nosuch'"),
    "module_not_class": (["plugins.policy_profiler=harness.profiler.trace.os"],
                         "plugins.policy_profiler: 'harness.profiler.trace.os' does not resolve to a class"),
    "function_not_class": (["plugins.rollout_profiler=harness.profiler.trace.resolve_probe_config"],
                           ("plugins.rollout_profiler: 'harness.profiler.trace.resolve_probe_config' does not "
                           "resolve to a class (it is a function)")),
    "no_such_module": (["plugins.policy_profiler=harness.profiler.nosuch.Profiler"],
                       "could not import module 'harness.profiler.nosuch'"),
    "trace_settings": (["plugins.env.HARNESS_TRACE_OPERATOR_STEPS=bogus"],
                       "plugins.env: HARNESS_TRACE_OPERATOR_STEPS='bogus'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_the_run_starts(case, tmp_path, capsys):
    overrides, expect = CASES[case]
    run_dir = tmp_path / "run"
    assert main(["run", W, *overrides, "--run-dir", str(run_dir), "-q"]) == 2  # main: 3 after Ray started
    assert expect in capsys.readouterr().err
    assert not (run_dir / "run.json").exists()


WRAPPER = r"""
import runpy, sys, json
sys.argv = ["golden"] + sys.argv[1:]
try:
    runpy.run_module("harness", run_name="__main__")
    code = 0
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "ray": "ray" in sys.modules, "torch": "torch" in sys.modules}), file=sys.stderr)
"""


def test_a_class_path_that_is_not_a_class_never_imports_ray(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WRAPPER, "run", W, *CASES["module_not_class"][0],
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300, cwd=REPO)
    outcome = json.loads(proc.stderr.strip().splitlines()[-1])
    assert outcome == {"code": 2, "ray": False, "torch": False}, proc.stderr


def test_static_probe_accepts_the_builtin_profilers_without_importing_them():
    before = set(sys.modules)
    assert static_probe("harness.profiler.trace.TracePolicyProfiler", POLICY_PROFILER_METHODS)["ok"]
    assert "harness.profiler.trace" in before or "harness.profiler.trace" not in sys.modules
    result = static_probe("json.JSONDecoder", POLICY_PROFILER_METHODS)
    assert not result["ok"] and "missing required method(s): begin_train_step" in result["error"]
