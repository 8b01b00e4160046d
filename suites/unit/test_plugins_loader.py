"""Loader contract (docs/plugins.md section 1), policy and rollout variants.

Upstream names: test_profiler_is_disabled_without_class_path,
test_profiler_loads_class_with_distributed_rank,
test_profiler_rejects_malformed_class_path[...],
test_profiler_fails_loudly_when_module_is_missing,
test_profiler_rejects_attribute_that_is_not_a_class,
test_profiler_rejects_class_with_missing_methods,
test_profiler_reports_constructor_failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from harness.plugins.loader import (
    POLICY_PROFILER_ENV,
    ROLLOUT_PROFILER_ENV,
    load_policy_profiler,
    load_rollout_profiler,
    parse_class_path,
)

PLUGIN_SOURCE = textwrap.dedent(
    """
    class GoodPolicy:
        def __init__(self, *, rank):
            self.rank = rank
        def begin_train_step(self): pass
        def finish_train_step(self): pass
        def abort_train_step(self, *, reason): pass
        def close(self): pass

    class GoodRollout:
        def __init__(self, *, rank):
            self.rank = rank
        def begin_engine_initialization(self): return object()
        def end_engine_initialization(self, token): pass
        def begin_rollout(self, *, step_id): pass
        def finish_rollout(self): pass
        def abort_rollout(self, *, reason): pass
        def close(self): pass

    class Incomplete:
        def __init__(self, *, rank): pass
        def close(self): pass

    class Exploding(GoodPolicy, GoodRollout):
        def __init__(self, *, rank):
            raise OSError("no output directory")

    NOT_A_CLASS = 42
    """
)

KINDS = [
    pytest.param(POLICY_PROFILER_ENV, load_policy_profiler, "GoodPolicy", "policy-worker environment", id="policy"),
    pytest.param(
        ROLLOUT_PROFILER_ENV, load_rollout_profiler, "GoodRollout", "generation-worker environment", id="rollout"
    ),
]


@pytest.fixture()
def plugin_pkg(tmp_path, monkeypatch):
    pkg = tmp_path / "fplugins_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "profilers.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(POLICY_PROFILER_ENV, raising=False)
    monkeypatch.delenv(ROLLOUT_PROFILER_ENV, raising=False)
    yield "fplugins_pkg.profilers"
    for name in [m for m in sys.modules if m.startswith("fplugins_pkg")]:
        del sys.modules[name]


@pytest.mark.parametrize("env_var,load,good,install_env", KINDS)
@pytest.mark.parametrize("value", [None, ""])
def test_profiler_is_disabled_without_class_path(env_var, load, good, install_env, value, monkeypatch):
    if value is None:
        monkeypatch.delenv(env_var, raising=False)
    else:
        monkeypatch.setenv(env_var, value)
    assert load(rank=0) is None


@pytest.mark.parametrize("env_var", [POLICY_PROFILER_ENV, ROLLOUT_PROFILER_ENV])
@pytest.mark.parametrize("value", ["unset", ""])
def test_unset_imports_nothing_in_a_fresh_interpreter(env_var, value, tmp_path):
    """Proven with sys.modules in a subprocess: neither the plugin nor torch gets imported."""
    pkg = tmp_path / "fplugins_canary"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('canary package was imported')\n")
    code = textwrap.dedent(
        f"""
        import json, os, sys
        os.environ.pop({POLICY_PROFILER_ENV!r}, None); os.environ.pop({ROLLOUT_PROFILER_ENV!r}, None)
        if {value!r} != "unset":
            os.environ[{env_var!r}] = {value!r}
        before = set(sys.modules)
        from harness.plugins import loader
        prof = loader.load_policy_profiler(rank=0), loader.load_rollout_profiler(rank=0)
        new = sorted(set(sys.modules) - before)
        print(json.dumps({{"profilers": [p is None for p in prof], "new": new}}))
        """
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["profilers"] == [True, True]
    assert not [m for m in result["new"] if m.startswith(("fplugins_canary", "harness.profiler", "torch", "ray"))]
    # Control: the same interpreter does import the canary when it is configured.
    env2 = {**env, env_var: "fplugins_canary.mod.Cls"}
    code2 = (
        "from harness.plugins import loader; loader.load_policy_profiler(rank=0); loader.load_rollout_profiler(rank=0)"
    )
    proc = subprocess.run([sys.executable, "-c", code2], env=env2, capture_output=True, text=True, check=False)
    assert "canary package was imported" in proc.stderr


@pytest.mark.parametrize("env_var,load,good,install_env", KINDS)
def test_profiler_loads_class_with_distributed_rank(env_var, load, good, install_env, plugin_pkg, monkeypatch):
    monkeypatch.setenv(env_var, f"{plugin_pkg}.{good}")
    profiler = load(rank=5)
    assert type(profiler).__name__ == good and profiler.rank == 5


@pytest.mark.parametrize("env_var,load,good,install_env", KINDS)
def test_environ_argument_overrides_process_environment(env_var, load, good, install_env, plugin_pkg):
    profiler = load(rank=2, environ={env_var: f"{plugin_pkg}.{good}"})
    assert profiler.rank == 2
    assert load(rank=2, environ={}) is None


@pytest.mark.parametrize("env_var,load,good,install_env", KINDS)
@pytest.mark.parametrize(
    "bad", ["Profiler", "module.", ".Profiler", "mod:Class", "pkg..Cls", "pkg.mod.Cls ", "pkg.mod:Cls"]
)
def test_profiler_rejects_malformed_class_path(env_var, load, good, install_env, bad, monkeypatch):
    monkeypatch.setenv(env_var, bad)
    with pytest.raises(ValueError, match="fully qualified class path") as info:
        load(rank=0)
    assert env_var in str(info.value)


def test_parse_class_path_splits_at_last_dot():
    assert parse_class_path("a.b.C") == ("a.b", "C")


@pytest.mark.parametrize("env_var,load,good,install_env", KINDS)
def test_profiler_fails_loudly_when_module_is_missing(env_var, load, good, install_env, monkeypatch):
    monkeypatch.setenv(env_var, "fplugins_missing_pkg.mod.Profiler")
    with pytest.raises(RuntimeError) as info:
        load(rank=3)
    message = str(info.value)
    assert "fplugins_missing_pkg.mod.Profiler" in message and "rank 3" in message
    assert f"Install the profiler in the {install_env}" in message
    assert isinstance(info.value.__cause__, ImportError)


@pytest.mark.parametrize("env_var,load,good,install_env", KINDS)
@pytest.mark.parametrize("attr", ["NOT_A_CLASS", "DoesNotExist"])
def test_profiler_rejects_attribute_that_is_not_a_class(
    env_var, load, good, install_env, attr, plugin_pkg, monkeypatch
):
    monkeypatch.setenv(env_var, f"{plugin_pkg}.{attr}")
    with pytest.raises(RuntimeError, match="does not resolve to a class") as info:
        load(rank=1)
    assert "rank 1" in str(info.value) and install_env in str(info.value)


@pytest.mark.parametrize("env_var,load,good,install_env", KINDS)
def test_profiler_rejects_class_with_missing_methods(env_var, load, good, install_env, plugin_pkg, monkeypatch):
    monkeypatch.setenv(env_var, f"{plugin_pkg}.Incomplete")
    with pytest.raises(RuntimeError, match="missing required method") as info:
        load(rank=0)
    expected = "begin_train_step" if env_var == POLICY_PROFILER_ENV else "begin_engine_initialization"
    assert expected in str(info.value) and "close" not in str(info.value).split("method(s):")[1]


@pytest.mark.parametrize("env_var,load,good,install_env", KINDS)
def test_policy_and_rollout_classes_are_not_interchangeable(env_var, load, good, install_env, plugin_pkg, monkeypatch):
    other = "GoodRollout" if good == "GoodPolicy" else "GoodPolicy"
    monkeypatch.setenv(env_var, f"{plugin_pkg}.{other}")
    with pytest.raises(RuntimeError, match="missing required method"):
        load(rank=0)


@pytest.mark.parametrize("env_var,load,good,install_env", KINDS)
def test_profiler_reports_constructor_failure(env_var, load, good, install_env, plugin_pkg, monkeypatch):
    monkeypatch.setenv(env_var, f"{plugin_pkg}.Exploding")
    with pytest.raises(RuntimeError, match="Failed to initialize .* for rank 7") as info:
        load(rank=7)
    assert isinstance(info.value.__cause__, OSError)
    assert f"{plugin_pkg}.Exploding" in str(info.value)
