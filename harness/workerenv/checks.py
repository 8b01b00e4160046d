"""``golden doctor``'s checks inside built worker environments (a subprocess each, that env's Python).

For one environment: its state (``stamp.inspect``: current and intact), the
declared modules import (the backend), each plugin class of the roles it serves
imports and has its protocol's methods (``harness.plugins.probe`` run by that
interpreter), and the smoke check (``harness.workerenv.smoke``: one tiny step).
Standard library only; the work happens in the children.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.plugins.environments import WorkerEnvironment, check_import
from harness.plugins.loader import (
    POLICY_INSTALL_ENVIRONMENT,
    POLICY_PROFILER_ENV,
    ROLLOUT_INSTALL_ENVIRONMENT,
    ROLLOUT_PROFILER_ENV,
)
from harness.plugins.protocols import POLICY_PROFILER_METHODS, ROLLOUT_PROFILER_METHODS
from harness.workerenv import declare, stamp
from harness.workerenv.build import check_imports

SMOKE_TIMEOUT_S = 600.0
BUILTIN_PLUGINS = {"policy": "harness.profiler.trace.TracePolicyProfiler",
                   "rollout": "harness.profiler.trace.TraceRolloutProfiler"}


@dataclass
class Line:
    ok: bool
    text: str


def roles_of(backend: str) -> list[str]:
    """The worker roles ``backend``'s environment serves (from its declaration)."""
    return sorted({r.split(".", 1)[0] for r in declare.declaration(backend).roles})


def plugin_environment(role: str, backend: str, python: str) -> WorkerEnvironment:
    if role == "policy":
        return WorkerEnvironment("policy", backend, python, "policy_profiler", POLICY_PROFILER_ENV,
                                 POLICY_PROFILER_METHODS, POLICY_INSTALL_ENVIRONMENT)
    return WorkerEnvironment("rollout", backend, python, "rollout_profiler", ROLLOUT_PROFILER_ENV,
                             ROLLOUT_PROFILER_METHODS, ROLLOUT_INSTALL_ENVIRONMENT)


def smoke(python: Path, backend: str, timeout_s: float = SMOKE_TIMEOUT_S) -> Line:
    cmd = [str(python), "-P", "-m", "harness.workerenv.smoke", backend]  # -P: never a harness/ of the cwd
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False,
                              env=stamp._clean_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Line(False, f"smoke: FAILS: {exc}")
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
        return Line(False, f"smoke: FAILS (exit {proc.returncode}): {tail}")
    if not result.get("ok"):
        return Line(False, f"smoke: FAILS: {result.get('error')}")
    step = result.get("step") or {}
    what = ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(step.items()))
    smoke_kind = declare.declaration(backend).smoke
    kind = "one train step on 1 rank" if smoke_kind == "train_step" else "the backend's modules import"
    return Line(True, f"smoke: {kind} ok ({what}; {result.get('seconds')}s)")


def check_environment(cache: Path, backend: str, plugins: dict[str, str | None] | None = None,
                      *, run_smoke: bool = True) -> list[Line]:
    """Every check of ``backend``'s environment in ``cache``; ``plugins``: {role: class path or
    None} to probe (default: the built-in trace profilers of the roles it serves)."""
    state = stamp.inspect(cache, backend)
    if state.status != "ok":
        return [Line(False, state.refusal())]
    decl = declare.declaration(backend)
    python = state.python
    out = [Line(True, f"environment: ok ({state.stamp.get('kind')}, {python})")]
    problem = check_imports(python, decl.imports)
    out.append(Line(problem is None, f"backend imports {', '.join(decl.imports)}: "
                    + ("ok" if problem is None else f"FAILS: {problem}")))
    wanted = plugins if plugins is not None else {r: BUILTIN_PLUGINS[r] for r in roles_of(backend)}
    for role, class_path in sorted(wanted.items()):
        if not class_path:
            out.append(Line(True, f"{role} plugin: not configured (nothing to check)"))
            continue
        check = check_import(plugin_environment(role, backend, str(python)), class_path)
        out.append(Line(check.ok, f"{role} plugin {class_path}: " + ("imports: ok" if check.ok
                                                                      else f"FAILS: {check.error}")))
    if run_smoke:
        out.append(smoke(python, backend))
    return out
