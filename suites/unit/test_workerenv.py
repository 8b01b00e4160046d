"""Worker-environment declaration, digest, stamp and selection (harness.workerenv): no network, no pip.

An "environment" here is a directory whose ``bin/python`` links to this test's
interpreter (a real interpreter that runs; what it sees installed is this one's
packages), stamped the way ``build`` stamps one, so every status of
``stamp.inspect`` is reached without installing anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.spec.typed import as_workload
from harness.workerenv import declare, select, stamp

PYPROJECT = """
[project]
name = "x"
[project.optional-dependencies]
workload = ["torch>=2.6", "ray>=2.40"]
megatron = ["megatron-core==0.16.1"]
"""


def _fake_env(cache: Path, backend: str, *, installed: list[str] | None = None, want: dict | None = None) -> Path:
    path = cache / backend
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(sys.executable)
    want = want or declare.resolved(declare.declaration(backend))
    listed = stamp.list_installed(path / "bin" / "python") if installed is None else installed
    stamp.write_stamp(path, {"schema": declare.SCHEMA, "backend": backend, "resolved": want,
                             "digest": declare.digest(want), "kind": "venv", "installed": listed,
                             "installed_sha256": stamp.installed_hash(listed)})
    return path


def test_every_spec_backend_has_an_environment_and_unknown_names_are_refused():
    from harness.spec.constraints import POLICY_BACKEND_FIXED  # noqa: F401 - the spec's backends exist

    assert set(declare.ENVIRONMENTS) == {"native", "megatron", "dtensor", "vllm"}
    for decl in declare.ENVIRONMENTS.values():
        assert "workload" in decl.extras and "harness" in decl.imports
    with pytest.raises(declare.WorkerEnvError, match="unknown worker environment 'sglang'.*native, megatron"):
        declare.declaration("sglang")


def test_requirements_come_from_pyproject_extras(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(PYPROJECT)
    assert declare.extra_requirements(("workload", "megatron"), pyproject) == [
        "torch>=2.6", "ray>=2.40", "megatron-core==0.16.1"]
    with pytest.raises(declare.WorkerEnvError, match="has no extra 'vllm'"):
        declare.extra_requirements(("vllm",), pyproject)
    with pytest.raises(declare.WorkerEnvError, match="cannot read the project's extras"):
        declare.extra_requirements(("workload",), tmp_path / "absent.toml")
    # the real checkout: the megatron env pins what pyproject.toml pins
    assert any(r.startswith("megatron-core") for r in declare.extra_requirements(("megatron",)))


def test_digest_moves_with_the_declaration_the_extras_and_the_overlay_base(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(PYPROJECT)
    decl = declare.declaration("megatron")
    base = declare.digest(declare.resolved(decl, pyproject=pyproject))
    assert base == declare.digest(declare.resolved(decl, pyproject=pyproject))  # stable
    pyproject.write_text(PYPROJECT.replace("0.16.1", "0.16.2"))
    assert declare.digest(declare.resolved(decl, pyproject=pyproject)) != base
    pyproject.write_text(PYPROJECT)
    changed = dataclasses.replace(decl, imports=(*decl.imports, "extra"))
    assert declare.digest(declare.resolved(changed, pyproject=pyproject)) != base
    assert declare.digest(declare.resolved(decl, pyproject=pyproject, layered_on="/usr/bin/python3")) != base
    reworded = dataclasses.replace(decl, note="other words", smoke="modules")  # not what a build installs
    assert declare.digest(declare.resolved(reworded, pyproject=pyproject)) == base
    assert declare.TORCH_PIN in declare.resolved(decl, pyproject=pyproject)["pins"]


def test_cache_dir_order():
    assert stamp.cache_dir("/x/y", {"GOLDEN_ENV_CACHE": "/a"}) == Path("/x/y")
    assert stamp.cache_dir(None, {"GOLDEN_ENV_CACHE": "/a", "XDG_CACHE_HOME": "/c"}) == Path("/a")
    assert stamp.cache_dir(None, {"XDG_CACHE_HOME": "/c"}) == Path("/c/grpo-golden-harness/worker-envs")
    assert stamp.cache_dir(None, {}) == Path.home() / ".cache" / "grpo-golden-harness" / "worker-envs"


def test_inspect_reaches_every_status(tmp_path):
    assert stamp.inspect(tmp_path, "native").status == "missing"
    (tmp_path / "megatron").mkdir()
    assert stamp.inspect(tmp_path, "megatron").status == "incomplete"  # an interrupted build: no stamp
    _fake_env(tmp_path, "native")
    ok = stamp.inspect(tmp_path, "native")
    assert ok.status == "ok" and ok.python == tmp_path / "native" / "bin" / "python", ok.reason
    # stale: the stamp was made for another declaration
    other = declare.resolved(dataclasses.replace(declare.declaration("dtensor"), extras=("workload", "dev")))
    _fake_env(tmp_path, "dtensor", want=other)
    stale = stamp.inspect(tmp_path, "dtensor")
    assert stale.status == "stale" and "golden env build dtensor" in stale.refusal()
    # broken: what the interpreter sees is not what the build recorded
    _fake_env(tmp_path, "vllm", installed=["vllm==0.32.0"])
    broken = stamp.inspect(tmp_path, "vllm")
    assert broken.status == "broken" and "vllm==0.32.0" in broken.reason
    assert stamp.inspect(tmp_path, "vllm", verify=False).status == "ok"  # only verification sees it
    # broken: the interpreter is gone
    (tmp_path / "native" / "bin" / "python").unlink()
    gone = stamp.inspect(tmp_path, "native")
    assert gone.status == "broken" and "does not run" in gone.reason


def test_a_damaged_stamp_is_an_incomplete_build(tmp_path):
    _fake_env(tmp_path, "native")
    (tmp_path / "native" / stamp.STAMP).write_text("{not json")
    assert stamp.inspect(tmp_path, "native").status == "incomplete"
    (tmp_path / "native" / stamp.STAMP).write_text(json.dumps({"schema": declare.SCHEMA + 1}))
    assert stamp.inspect(tmp_path, "native").status == "incomplete"


SPEC = as_workload({"policy": {"backend": "megatron"}, "rollout": {"backend": "native"}})


def test_selection_default_is_the_current_interpreter():
    assert select.selection(None, {}) == "current"
    assert select.selection(None, {"GOLDEN_WORKER_ENV": "auto"}) == "auto"
    assert select.selection("current", {"GOLDEN_WORKER_ENV": "auto"}) == "current"  # the flag wins
    assert select.worker_pythons(SPEC, "current") == {"policy": sys.executable, "rollout": sys.executable}


def test_selection_refuses_a_missing_environment_naming_backend_and_command(tmp_path):
    _fake_env(tmp_path, "native")
    with pytest.raises(declare.WorkerEnvError,
                       match=r"policy.backend=megatron: worker environment 'megatron' .* missing.*"
                             r"golden env build megatron --cache-dir"):
        select.worker_pythons(SPEC, str(tmp_path))
    _fake_env(tmp_path, "megatron")
    got = select.worker_pythons(SPEC, str(tmp_path))
    assert got == {"policy": str(tmp_path / "megatron" / "bin" / "python"),
                   "rollout": str(tmp_path / "native" / "bin" / "python")}
    with pytest.raises(declare.WorkerEnvError, match="--worker-env /nonexistent: not 'current', 'auto'"):
        select.worker_pythons(SPEC, "/nonexistent")


def test_actor_runtime_env_sets_py_executable_only_when_selected(tmp_path, monkeypatch):
    _fake_env(tmp_path, "native")
    spec = as_workload({"policy": {"backend": "native"}, "rollout": {"backend": "native"}})
    monkeypatch.delenv("GOLDEN_WORKER_ENV", raising=False)
    assert select.actor_runtime_env("policy", spec, {"A": "1"}) == {"env_vars": {"A": "1"}}
    monkeypatch.setenv("GOLDEN_WORKER_ENV", str(tmp_path))
    assert select.actor_runtime_env("rollout", spec, {"A": "1"}) == {
        "env_vars": {"A": "1"}, "py_executable": str(tmp_path / "native" / "bin" / "python")}


def test_cli_bad_input_exits_2_without_a_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GOLDEN_ENV_CACHE", str(tmp_path))
    assert main(["env", "build", "native", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown worker environment 'nope'" in err and "Traceback" not in err
    assert not (tmp_path / "native").exists()  # every name is checked before anything is built
    assert main(["env", "path", "dtensor"]) == 2
    assert "golden env build dtensor" in capsys.readouterr().err
    _fake_env(tmp_path, "dtensor")
    assert main(["env", "path", "dtensor"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "dtensor" / "bin" / "python")
    assert main(["env", "list"]) == 0
    listing = capsys.readouterr().out
    assert "dtensor   ok" in listing and "native    missing" in listing


def test_run_with_a_missing_environment_is_refused_before_it_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GOLDEN_WORKER_ENV", raising=False)
    run_dir = tmp_path / "run"
    code = main(["run", "qwen3_moe_tiny_dtensor", "--worker-env", str(tmp_path), "--run-dir", str(run_dir), "-q"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "policy.backend=dtensor: worker environment 'dtensor'" in err and "golden env build dtensor" in err
    assert "Traceback" not in err and not run_dir.exists()
    assert os.environ.get("GOLDEN_WORKER_ENV") is None  # a refused selection is not carried on


def test_backend_package_check_defers_to_a_selected_worker_environment():
    from harness.spec.backends import missing_backends, module_available

    spec = {"policy": {"backend": "native"}, "rollout": {"backend": "vllm"}}
    if module_available("vllm"):
        pytest.skip("vllm is installed here: nothing is missing either way")
    assert [b.value for b in missing_backends(spec)] == ["vllm"]  # this interpreter has no vllm
    os.environ["GOLDEN_WORKER_ENV"] = "auto"
    try:
        assert missing_backends(spec) == []  # the rollout workers' environment answers for it
    finally:
        del os.environ["GOLDEN_WORKER_ENV"]
