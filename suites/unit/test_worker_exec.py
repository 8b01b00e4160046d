"""``harness/runner/worker_exec.py`` starts a worker exactly as Ray's own ``setup_worker.py`` does.

Ray's script is the oracle: both scripts get the same arguments and environment
(what the raylet hands a Python worker's setup process: the worker's command line,
``--serialized-runtime-env-context`` and ``--language``) and exec a probe in place of
the worker, which writes the command line and environment it was started with.
Everything must match: argv, every environment variable (bash's own ``_``, ``SHLVL``
and ``PWD`` included), the working directory. ``test_the_fast_path_does_not_import_ray``
shows the point of it (no ray imported before the exec); the fallbacks hand anything else to Ray's script unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.runner import worker_exec

SCRIPT = Path(worker_exec.__file__)
PROBE = """import json, os, sys
with open(os.environ["PROBE_OUT"], "w") as fh:
    json.dump({"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd()}, fh)
"""


def _started(setup: Path, context: dict | None, tmp_path: Path, language: str = "PYTHON",
             worker_args: tuple[str, ...] = ()) -> dict:
    """What the probe saw when ``setup`` started it (the probe stands in for default_worker.py)."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out = tmp_path / f"seen-{setup.name}.json"
    argv = [sys.executable, str(setup), str(probe), "--node-ip-address=127.0.0.1", *worker_args]
    if context is not None:
        argv.append(f"--serialized-runtime-env-context={json.dumps(context)}")
    argv.append(f"--language={language}")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env.update(PROBE_OUT=str(out), GOLDEN_TEST_HOME="/home/x")
    subprocess.run(argv, env=env, cwd=tmp_path, check=True, timeout=60)
    return json.loads(out.read_text())


def _both(context: dict | None, tmp_path: Path, **kw) -> tuple[dict, dict]:
    ours = _started(SCRIPT, context, tmp_path, **kw)
    rays = _started(Path(worker_exec.ray_setup_worker()), context, tmp_path, **kw)
    for seen in (ours, rays):
        seen["env"].pop("PROBE_OUT")  # each run's own output file
    return ours, rays


CONTEXTS = {
    "no runtime env": None,
    "empty context": {},
    "env vars with references": {"env_vars": {"A": "x${GOLDEN_TEST_HOME}y", "B": "$GOLDEN_TEST_HOME/z",
                                              "C": "${GOLDEN_UNSET_VARIABLE}c", "D": "plain"}},
    "py_executable with its own arguments": {"py_executable": f"{sys.executable} -S -E",
                                             "env_vars": {"OMP_NUM_THREADS": "1"}},
    "command prefix": {"command_prefix": ["true", "&&"], "env_vars": {"E": "1"}},
    "worker entrypoint overridden": "override",
}


@pytest.mark.parametrize("case", list(CONTEXTS))
def test_the_worker_starts_as_rays_script_starts_it(case, tmp_path):
    context = CONTEXTS[case]
    if context == "override":  # the entrypoint replaces the probe path Ray was given: a second probe
        other = tmp_path / "other_probe.py"
        other.write_text(PROBE)
        context = {"override_worker_entrypoint": str(other)}
    ours, rays = _both(context, tmp_path, worker_args=("--quoted=a b 'c'", "--dollar=$HOME"))
    assert ours == rays


def test_the_fast_path_does_not_import_ray():
    # main() up to its exec (replaced by a stub that records what would run): ray never imported
    code = ("import sys, harness.runner.worker_exec as w\n"
            "w.os.execvp = lambda *a: print(repr(a))\n"
            "w.main(['default_worker.py', '--serialized-runtime-env-context={\"env_vars\": {\"A\": \"1\"}}', "
            "'--language=PYTHON'])\n"
            "print('ray' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    execed, ray_imported = result.stdout.strip().splitlines()
    assert execed.startswith("('bash', ['bash', '-c', 'exec ") and "default_worker.py" in execed
    assert ray_imported == "False"


@pytest.mark.parametrize("context", [
    {"java_jars": ["/opt/x.jar"]},       # a field only Ray's script interprets
    {"future_field": 1},                 # a field this script does not know
    {"command_prefix": "not a list"},
    {"py_executable": 3},
])
def test_a_context_it_does_not_handle_goes_to_rays_script(context):
    assert worker_exec.worker_command(context, ["default_worker.py"]) is None


def test_rays_script_takes_what_it_does_not_handle(tmp_path):
    # a context field Ray knows and this script leaves to it: the worker still starts as Ray starts it
    ours, rays = _both({"java_jars": ["/opt/x.jar"], "env_vars": {"A": "1"}}, tmp_path)
    assert ours == rays


def test_env_expansion_matches_rays_update_envs(monkeypatch):
    from ray._private.utils import update_envs

    monkeypatch.setenv("GOLDEN_TEST_HOME", "/h")
    monkeypatch.delenv("GOLDEN_UNSET_VARIABLE", raising=False)
    values = {"A": "x${GOLDEN_TEST_HOME}y", "B": "$GOLDEN_TEST_HOME", "C": "${GOLDEN_UNSET_VARIABLE}c",
              "D": "$GOLDEN_UNSET_VARIABLE d", "E": "${lower_case}e", "F": "$$"}
    ours = {k: worker_exec.expand_env(v) for k, v in values.items()}
    for k in values:
        monkeypatch.delenv(k, raising=False)
    update_envs(values)
    assert ours == {k: os.environ[k] for k in values}
