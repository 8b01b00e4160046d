"""The first process of every Ray worker in a Ray instance this harness starts: standard library only.

The raylet starts each Python worker as ``python SETUP default_worker.py ARGS...
--serialized-runtime-env-context=JSON --language=PYTHON``, where ``SETUP`` is
Ray's ``ray/_private/workers/setup_worker.py``. That script imports part of ray
(about 0.3-0.7 s of CPU on the 2-core box, for every worker, before the worker
itself starts, which imports ray again) only to read the runtime-env context and
``exec`` the worker. This script is a drop-in for it (``harness.runner.ray_start``
names it when the harness starts a local Ray instance) that does the same for
what the harness's instances start, Python workers on Linux, without importing ray:

* the same arguments (``argparse.parse_known_args`` of the two options, the rest
  passed through);
* what the import of Ray's script sets in the environment (:data:`IMPORT_ENV`), then
  the context's ``env_vars`` applied as ``ray._private.utils.update_envs`` applies
  them (``$X`` / ``${X}`` expanded from the current environment, references to unset
  variables removed);
* the same command, run the same way: ``bash -c "<command_prefix> exec <py_executable>
  <passthrough args, shell-quoted>"``, with the context's
  ``override_worker_entrypoint`` in place of the first passthrough argument, so
  what bash parses, expands and exports is exactly what Ray's script hands it.

Anything else (another language, a context field this script does not know, a
context that is not a JSON object, another platform) is handed to Ray's own
script with the arguments unchanged (``os.execv``), so nothing starts differently,
only slower. ``suites/unit/test_worker_exec.py`` runs both scripts on the same
arguments and requires the same final command line and environment.
"""

import argparse
import importlib.util
import json
import os
import re
import shlex
import sys

# What importing Ray's setup script sets in its environment, before the context's variables are
# applied (``ray._private.client_mode_hook``: every worker starts with client mode off).
IMPORT_ENV = {"RAY_CLIENT_MODE": "0"}
CONTEXT_FIELDS = frozenset({"command_prefix", "env_vars", "py_executable", "override_worker_entrypoint",
                            "java_jars"})


def ray_setup_worker() -> str:
    """The path of Ray's own setup_worker.py, found without importing ray."""
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("worker_exec: the ray package is not importable")
    return os.path.join(next(iter(spec.submodule_search_locations)), "_private", "workers", "setup_worker.py")


def hand_to_ray(argv: list[str]) -> None:
    """Run Ray's own setup script with these arguments, in this process."""
    os.execv(sys.executable, [sys.executable, ray_setup_worker(), *argv])


def expand_env(value: str) -> str:
    """``value`` as Ray's ``update_envs`` sets it: variables expanded, unset ``${X}`` removed."""
    return re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(value))


def worker_command(context: dict, passthrough: list[str]) -> str | None:
    """The ``bash -c`` command Ray's ``RuntimeEnvContext.exec_worker`` runs for a Python worker
    on Linux, or None when ``context`` holds anything that path does not handle alone."""
    if set(context) - CONTEXT_FIELDS or context.get("java_jars"):
        return None
    prefix = context.get("command_prefix") or []
    py_executable = context.get("py_executable") or sys.executable
    entrypoint = context.get("override_worker_entrypoint")
    if not (isinstance(prefix, list) and all(isinstance(p, str) for p in prefix) and isinstance(py_executable, str)
            and (entrypoint is None or isinstance(entrypoint, str))):
        return None
    args = list(passthrough)
    if entrypoint:
        if not args:
            return None
        args[0] = entrypoint
    return " ".join([*prefix, "exec", py_executable, *(shlex.quote(a) for a in args)])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()  # as Ray's: -h/--help ends in SystemExit, handed to Ray's script
    parser.add_argument("--serialized-runtime-env-context", type=str)
    parser.add_argument("--language", type=str)
    try:
        args, passthrough = parser.parse_known_args(argv)
        context = json.loads(args.serialized_runtime_env_context or "{}")
    except (SystemExit, ValueError):
        hand_to_ray(argv)
        return
    env_vars = context.get("env_vars") if isinstance(context, dict) else None
    command = None
    if (isinstance(context, dict) and args.language == "PYTHON" and sys.platform.startswith("linux")
            and isinstance(env_vars or {}, dict) and all(isinstance(v, str) for v in (env_vars or {}).values())):
        command = worker_command(context, passthrough)
    if command is None:
        hand_to_ray(argv)
        return
    os.environ.update(IMPORT_ENV)
    for key, value in (env_vars or {}).items():
        os.environ[key] = expand_env(value)
    os.execvp("bash", ["bash", "-c", command])


if __name__ == "__main__":
    main(sys.argv[1:])
