"""Loader properties over arbitrary class-path strings and environments (issue 8 item 1)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.plugins.loader import (
    POLICY_PROFILER_ENV,
    ROLLOUT_PROFILER_ENV,
    load_policy_profiler,
    load_rollout_profiler,
    parse_class_path,
)

LOADERS = {POLICY_PROFILER_ENV: load_policy_profiler, ROLLOUT_PROFILER_ENV: load_rollout_profiler}

identifier = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
# module names that certainly do not exist: imported nothing, so RuntimeError
missing_module_path = st.lists(identifier, min_size=1, max_size=3).map(lambda parts: "zz_absent_" + ".".join(parts))
# well-formed class paths of modules that cannot exist (unicode letters allowed): plain st.text
# almost never yields a dotted identifier, so without these the RuntimeError branch went untested
unicode_part = st.text(st.characters(categories=("L",)), min_size=1, max_size=6).filter(str.isidentifier)
absent_class_path = st.lists(unicode_part, min_size=2, max_size=3).map(lambda parts: "zz_absent_" + ".".join(parts))
junk_env = st.dictionaries(st.sampled_from(["PATH", "HOME", "X", "NRL_OTHER", "RANK"]), st.text(max_size=10))


def _well_formed(path: str) -> bool:
    module, _, cls = path.rpartition(".")
    return bool(module and cls and all(p.isidentifier() for p in path.split(".")))


@given(value=st.text(max_size=40) | absent_class_path, env_var=st.sampled_from(sorted(LOADERS)),
       rank=st.integers(0, 4096))
def test_any_string_is_refused_with_the_documented_error_type(value, env_var, rank):
    """Every configured value yields None (empty), ValueError (malformed) or RuntimeError (unloadable)."""
    assert "zz_absent" not in sys.modules
    load = LOADERS[env_var]
    if value == "":
        assert load(rank=rank, environ={env_var: value}) is None
        return
    if not _well_formed(value):
        with pytest.raises(ValueError, match="fully qualified class path"):
            load(rank=rank, environ={env_var: value})
        return
    if value.split(".")[0] in sys.modules or value.startswith(("harness", "suites", "test")):
        return  # an importable module: covered by the example tests
    try:
        result = load(rank=rank, environ={env_var: value})
    except RuntimeError as exc:
        assert value in str(exc) and f"rank {rank}" in str(exc)
    else:  # pragma: no cover - a random installed module exposing a profiler class
        pytest.fail(f"{value!r} unexpectedly loaded {result!r}")


@given(path=missing_module_path, cls=st.from_regex(r"[A-Z][A-Za-z0-9]{0,8}", fullmatch=True), rank=st.integers(0, 99))
def test_unimportable_module_names_class_rank_and_environment(path, cls, rank):
    for env_var, load in LOADERS.items():
        with pytest.raises(RuntimeError) as info:
            load(rank=rank, environ={env_var: f"{path}.{cls}"})
        message = str(info.value)
        assert f"{path}.{cls}" in message and f"rank {rank}" in message
        assert "environment" in message and info.value.__cause__ is not None


# The "imports nothing" property runs in a fresh interpreter: in this process an
# earlier test (any order) may already have imported what a broken loader would
# import, and sys.modules would show nothing new. Same examples as the ci profile.
UNSET_PROPERTY = r"""
import json, sys
from hypothesis import given, settings, strategies as st
from harness.plugins.loader import load_policy_profiler, load_rollout_profiler
PLANTED
junk_env = st.dictionaries(st.sampled_from(["PATH", "HOME", "X", "NRL_OTHER", "RANK"]), st.text(max_size=10))
seen = []

@settings(derandomize=True, max_examples=60, database=None, deadline=None)
@given(env=junk_env, rank=st.integers(0, 99))
def unset_selector_imports_nothing(env, rank):
    before = set(sys.modules)
    assert load_policy_profiler(rank=rank, environ=env) is None
    assert load_rollout_profiler(rank=rank, environ=env) is None
    new = sorted(set(sys.modules) - before)
    assert not new, f"the loader imported {new} with its selector unset (env {env!r})"
    seen.append(sorted(env))

unset_selector_imports_nothing()
print(json.dumps({"examples": len(seen), "envs": len({tuple(e) for e in seen})}))
"""

# A loader that imports a module while its selector is unset (a stand-in for a
# default profiler imported too early); colorsys is a module nothing here imports.
PLANTED_IMPORT = """
import harness.plugins.loader as _loader
_original = _loader.load_profiler
def _load_profiler(**kw):
    import colorsys  # noqa: F401
    return _original(**kw)
_loader.load_profiler = _load_profiler
"""


def _unset_property_in_fresh_interpreter(planted: str = "") -> subprocess.CompletedProcess:
    code = UNSET_PROPERTY.replace("PLANTED", planted)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_unset_selector_returns_none_whatever_else_is_set():
    proc = _unset_property_in_fresh_interpreter()
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["examples"] >= 20 and report["envs"] >= 5, report  # the strategy varied the environment


def test_the_fresh_interpreter_property_catches_an_import_whatever_ran_before():
    import colorsys  # noqa: F401 - imported HERE, as an earlier test might have: the child must still see it
    proc = _unset_property_in_fresh_interpreter(PLANTED_IMPORT)
    assert proc.returncode != 0
    assert "the loader imported ['colorsys'] with its selector unset" in proc.stderr, proc.stderr


@given(parts=st.lists(identifier, min_size=2, max_size=5))
def test_parse_splits_at_the_last_dot(parts):
    path = ".".join(parts)
    assert parse_class_path(path) == (".".join(parts[:-1]), parts[-1])
    for bad in (path + ".", "." + path, path.replace(".", ":", 1), parts[0]):
        with pytest.raises(ValueError, match="fully qualified class path"):
            parse_class_path(bad)
