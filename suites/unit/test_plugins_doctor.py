"""``golden doctor``: plugin import checks in each worker environment (real subprocesses)."""

from __future__ import annotations

import sys

from harness.cli import main
from harness.plugins.environments import backend_python, check_import, worker_environments
from harness.spec.typed import as_workload

SPEC = as_workload({
    "policy": {"backend": "megatron"},
    "rollout": {"backend": "native"},
    "plugins": {"policy_profiler": "harness.profiler.trace.TracePolicyProfiler", "rollout_profiler": None},
})


def test_worker_environments_follow_backends_and_overrides():
    envs = worker_environments(SPEC, environ={"HARNESS_WORKER_PYTHON_MEGATRON": "/opt/mcore/bin/python"})
    policy, rollout = envs
    assert (policy.role, policy.backend, policy.python) == ("policy", "megatron", "/opt/mcore/bin/python")
    assert (rollout.role, rollout.python) == ("rollout", sys.executable)
    assert policy.env_var == "NRL_POLICY_PROFILER_CLASS" and rollout.env_var == "NRL_ROLLOUT_PROFILER_CLASS"
    assert backend_python("native", environ={}) == sys.executable


def test_probe_reports_ok_missing_module_wrong_kind_and_missing_interpreter():
    policy_env, rollout_env = worker_environments(SPEC, environ={})
    assert check_import(policy_env, "harness.profiler.trace.TracePolicyProfiler").ok
    missing = check_import(policy_env, "fdoctor_absent.mod.Prof")
    assert not missing.ok and "No module named 'fdoctor_absent'" in missing.error
    assert "policy-worker environment" in missing.hint and "plugins.policy_profiler" in missing.hint
    wrong = check_import(rollout_env, "harness.profiler.trace.TracePolicyProfiler")
    assert not wrong.ok and "begin_engine_initialization" in wrong.error
    broken_env = worker_environments(SPEC, environ={"HARNESS_WORKER_PYTHON_MEGATRON": "/nonexistent/python"})[0]
    no_python = check_import(broken_env, "harness.profiler.trace.TracePolicyProfiler")
    assert not no_python.ok and "/nonexistent/python" in no_python.error


def test_doctor_cli_exit_codes_and_hint(capsys):
    assert main(["doctor", "qwen3_moe_tiny_smoke"]) == 0
    out = capsys.readouterr().out
    assert "TracePolicyProfiler imports in the policy-worker environment" in out
    assert "TraceRolloutProfiler imports in the generation-worker environment" in out
    code = main(["doctor", "qwen3_moe_tiny_smoke", "-o", "plugins.rollout_profiler=fdoctor_absent.mod.Prof",
                 "-o", "plugins.policy_profiler=null"])
    out = capsys.readouterr().out
    assert code == 1
    assert "policy_profiler: not configured" in out
    assert "fdoctor_absent.mod.Prof FAILS in the generation-worker environment" in out
    assert "hint: install the package providing 'fdoctor_absent.mod.Prof' in the generation-worker environment" in out
    assert main(["doctor", "no_such_workload_xyz"]) == 2


def test_doctor_parses_the_trace_profilers_settings_in_plugins_env(capsys):
    good = "plugins.env={HARNESS_TRACE_OPERATOR_STEPS: 'every:10', HARNESS_TRACE_OPERATORS: recordfn}"
    assert main(["doctor", "qwen3_moe_tiny_smoke", good]) == 0
    assert "plugins.env: the trace profilers' settings parse: ok" in capsys.readouterr().out
    bad = "plugins.env={HARNESS_TRACE_OPERATOR_STEPS: 'every:0', HARNESS_TRACE_COLLECTIVES: hooks}"
    assert main(["doctor", "qwen3_moe_tiny_smoke", bad]) == 1
    out = capsys.readouterr().out
    assert "HARNESS_TRACE_OPERATOR_STEPS='every:0'" in out and "HARNESS_TRACE_COLLECTIVES='hooks'" in out
    # a third-party profiler's env is not the trace profilers' business
    other = ["plugins.policy_profiler=null", "plugins.rollout_profiler=null", bad]
    assert main(["doctor", "qwen3_moe_tiny_smoke", *other]) == 0
