"""Which interpreter each worker of a run starts with: ``--worker-env`` / ``GOLDEN_WORKER_ENV``.

* ``current`` (the default, also when unset): every worker runs this interpreter,
  as before (CI and the quickstart do not change);
* ``auto``: each worker runs its backend's built environment in the default cache
  (``stamp.cache_dir``): policy ranks ``policy.backend``'s, rollout workers
  ``rollout.backend``'s (the ``worker_env`` of the backend's record, ``harness.registry``);
* a directory: the same, from that cache directory.

:func:`worker_pythons` resolves a spec before anything starts and refuses (a
WorkerEnvError, exit 2) an environment that is missing, incomplete, stale or
broken, naming the backend and ``golden env build <backend>``. Standard library only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.workerenv import declare, stamp

if TYPE_CHECKING:
    from harness.spec.typed import Workload

SELECT_ENV = "GOLDEN_WORKER_ENV"
CURRENT, AUTO = "current", "auto"


def selection(value: str | None = None, environ: dict | None = None) -> str:
    """The selection in force: ``value`` (the CLI flag), else ``$GOLDEN_WORKER_ENV``, else current."""
    env = os.environ if environ is None else environ
    chosen = value or env.get(SELECT_ENV) or CURRENT
    return chosen.strip() or CURRENT


def cache_of(chosen: str) -> Path | None:
    """The cache directory a selection reads from (None: the current interpreter)."""
    if chosen == CURRENT:
        return None
    if chosen == AUTO:
        return stamp.cache_dir()
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise declare.WorkerEnvError(f"--worker-env {chosen}: not 'current', 'auto' or an existing directory "
                                     "of built worker environments")
    return path.absolute()


def worker_pythons(spec: Workload, chosen: str | None = None, *, verify: bool = True) -> dict[str, str]:
    """{role: interpreter} for the policy and rollout workers of ``spec`` under the selection
    (default :func:`selection`); WorkerEnvError naming the backend when its environment is unusable."""
    chosen = selection(chosen)
    cache = cache_of(chosen)
    roles = declare.backends_of(spec)
    if cache is None:
        return dict.fromkeys(roles, sys.executable)
    out: dict[str, str] = {}
    states: dict[str, stamp.EnvState] = {}
    for role, backend in roles.items():
        env = declare.environment_of(role, backend)  # the backend record's worker_env
        if env is None:
            raise declare.WorkerEnvError(f"{role}.backend: {backend!r} has no worker environment "
                                         f"(known: {', '.join(declare.ENVIRONMENTS)})")
        state = states.get(env) or stamp.inspect(cache, env, verify=verify)
        states[env] = state
        if state.status != "ok":
            raise declare.WorkerEnvError(f"{role}.backend={backend}: {state.refusal()}"
                                         + ("" if chosen == AUTO else f" --cache-dir {cache}"))
        out[role] = os.fspath(state.python)
    return out


RECORD = "worker_envs.json"  # in the run directory: which interpreter each worker ran (not a gated surface)


# Installed by the warm runtime while its Ray is up (``harness.runner.warm``, which passes
# ``zygote_runtime_env``): (the actor's runtime_env, a zygote flavour or None) -> the one that
# forks it from the runtime's fork server. Registered from above so that this module never
# imports the runner.
_warm_runtime_env: Callable[[dict, str | None], dict] | None = None


def set_warm_runtime_env(hook: Callable[[dict, str | None], dict] | None) -> None:
    """Install (or, with None, remove) the warm runtime's runtime_env rewrite."""
    global _warm_runtime_env
    _warm_runtime_env = hook


def actor_runtime_env(role: str, spec: Workload, env_vars: dict[str, str]) -> dict:
    """A Ray actor's ``runtime_env`` for a ``role`` worker of ``spec``: its env vars, and
    ``py_executable`` when the selection puts that role in a built environment, else the warm
    runtime's fork server when this process has one (:func:`set_warm_runtime_env`); a policy
    rank asks for the server's flavour of its ``policy.backend`` (the zygote has flavours for
    the backends whose ranks are never pooled; others get the plain server)."""
    runtime_env: dict = {"env_vars": dict(env_vars)}
    if selection() != CURRENT:
        python = worker_pythons(spec, verify=False)[role]
        if python != sys.executable:
            runtime_env["py_executable"] = python
        return runtime_env
    hook = _warm_runtime_env
    return hook(runtime_env, spec.policy.backend if role == "policy" else None) if hook is not None else runtime_env


def in_worker_env(role: str, environ: dict | None = None) -> bool:
    """Whether ``role``'s workers run in a built environment under the selection in force (then
    their backend's packages are that environment's business, not this interpreter's)."""
    return role in ("policy", "rollout") and selection(None, environ) != CURRENT
