"""Worker environments that plugins must import in, and the doctor's import check.

Policy and rollout workers may run in different interpreters (NeMo RL builds
one venv per backend: automodel/DTensor and mcore policy workers, vLLM
generation workers). A :class:`WorkerEnvironment` names the interpreter and
the env vars of one worker kind. Today every backend uses the current
interpreter; ``HARNESS_WORKER_PYTHON_<BACKEND>`` (e.g.
``HARNESS_WORKER_PYTHON_MEGATRON``) points a backend at another one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.plugins.loader import (
    POLICY_INSTALL_ENVIRONMENT,
    POLICY_PROFILER_ENV,
    ROLLOUT_INSTALL_ENVIRONMENT,
    ROLLOUT_PROFILER_ENV,
)
from harness.plugins.protocols import POLICY_PROFILER_METHODS, ROLLOUT_PROFILER_METHODS

if TYPE_CHECKING:
    from harness.spec.typed import Workload

PROBE_SCRIPT = Path(__file__).with_name("probe.py")
PYTHON_OVERRIDE_PREFIX = "HARNESS_WORKER_PYTHON_"


@dataclass(frozen=True)
class WorkerEnvironment:
    """One worker kind's interpreter and the plugin it must be able to load."""

    role: str  # policy | rollout
    backend: str  # spec policy.backend / rollout.backend
    python: str
    plugin_key: str  # key in the spec's plugins block
    env_var: str
    required_methods: tuple[str, ...]
    install_environment: str
    env_vars: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.install_environment} ({self.backend}, {self.python})"


def backend_python(backend: str, environ: Mapping[str, str] | None = None) -> str:
    """Interpreter of ``backend``'s workers: the override variable or this interpreter."""
    env = os.environ if environ is None else environ
    return env.get(PYTHON_OVERRIDE_PREFIX + backend.upper().replace("-", "_")) or sys.executable


def worker_environments(spec: Workload, environ: Mapping[str, str] | None = None) -> list[WorkerEnvironment]:
    """The policy-worker and rollout-worker environments of a loaded spec."""
    policy_backend = spec.policy.backend
    rollout_backend = spec.rollout.backend
    return [
        WorkerEnvironment(
            role="policy",
            backend=policy_backend,
            python=backend_python(policy_backend, environ),
            plugin_key="policy_profiler",
            env_var=POLICY_PROFILER_ENV,
            required_methods=POLICY_PROFILER_METHODS,
            install_environment=POLICY_INSTALL_ENVIRONMENT,
        ),
        WorkerEnvironment(
            role="rollout",
            backend=rollout_backend,
            python=backend_python(rollout_backend, environ),
            plugin_key="rollout_profiler",
            env_var=ROLLOUT_PROFILER_ENV,
            required_methods=ROLLOUT_PROFILER_METHODS,
            install_environment=ROLLOUT_INSTALL_ENVIRONMENT,
        ),
    ]


@dataclass(frozen=True)
class ImportCheck:
    """Outcome of probing one plugin class in one worker environment."""

    environment: WorkerEnvironment
    class_path: str
    ok: bool
    error: str | None

    @property
    def hint(self) -> str:
        return (
            f"install the package providing {self.class_path!r} in the {self.environment.install_environment} "
            f"(interpreter {self.environment.python}), or set plugins.{self.environment.plugin_key} to null"
        )


def check_import(env: WorkerEnvironment, class_path: str, *, timeout_s: float = 120.0) -> ImportCheck:
    """Run the probe in ``env``'s interpreter with the worker's variables set."""
    child_env = {**os.environ, **env.env_vars, env.env_var: class_path}
    cmd = [env.python, str(PROBE_SCRIPT), "--class-path", class_path, "--methods", ",".join(env.required_methods)]
    try:
        proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ImportCheck(env, class_path, False, f"could not run {env.python}: {exc}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return ImportCheck(env, class_path, False, f"probe failed (exit {proc.returncode}): {' | '.join(tail)}")
    return ImportCheck(env, class_path, bool(result.get("ok")), result.get("error"))


def check_plugins(spec: Workload, environ: Mapping[str, str] | None = None) -> list[ImportCheck]:
    """Probe every configured plugin in its worker environment (skipping unset ones)."""
    checks = []
    for env in worker_environments(spec, environ):
        class_path = getattr(spec.plugins, env.plugin_key)
        if class_path:
            checks.append(check_import(env, class_path))
    return checks
