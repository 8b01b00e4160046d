"""Loading a profiler plugin from a class path in the environment.

Contract (docs/plugins.md section 1):

* the variable unset or empty -> ``None`` and nothing is imported;
* the value is a dotted ``pkg.module.ClassName`` split at the last dot; any
  other shape (``Profiler``, ``module.``, ``.Profiler``, ``mod:Class``) ->
  ``ValueError``;
* module import failure, attribute missing or not a class, required methods
  missing, constructor failure -> ``RuntimeError`` naming the class path, the
  rank and the environment to install the plugin in, chained to the cause.

A configured but broken plugin therefore fails worker start-up instead of
silently running unprofiled. This module imports neither torch nor ray.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from harness.plugins.protocols import (
    POLICY_PROFILER_METHODS,
    ROLLOUT_PROFILER_METHODS,
    PolicyProfiler,
    RolloutProfiler,
)

POLICY_PROFILER_ENV = "NRL_POLICY_PROFILER_CLASS"
ROLLOUT_PROFILER_ENV = "NRL_ROLLOUT_PROFILER_CLASS"
POLICY_INSTALL_ENVIRONMENT = "policy-worker environment"
ROLLOUT_INSTALL_ENVIRONMENT = "generation-worker environment"


def parse_class_path(class_path: str, *, env_var: str | None = None) -> tuple[str, str]:
    """Split ``pkg.module.Class`` into ``("pkg.module", "Class")``; ValueError otherwise.

    Every dotted component must be a Python identifier, so ``mod:Class``,
    ``module.``, ``.Profiler``, ``a..B`` and whitespace are refused.
    """
    where = f" (from {env_var})" if env_var else ""
    module_name, _, class_name = class_path.rpartition(".")
    parts = class_path.split(".")
    if not module_name or not class_name or not all(p.isidentifier() for p in parts):
        raise ValueError(
            f"profiler class {class_path!r}{where} must be a fully qualified class path "
            "of the form 'package.module.ClassName' ('module:Class' is not supported)"
        )
    return module_name, class_name


def resolve_profiler_class(
    class_path: str,
    *,
    profiler_kind: str,
    required_methods: Sequence[str],
    install_environment: str,
    rank: int | None,
    env_var: str | None = None,
) -> type:
    """Import and check a plugin class without constructing it (used by ``golden doctor``)."""
    module_name, class_name = parse_class_path(class_path, env_var=env_var)
    hint = f"Install the profiler in the {install_environment}."
    at_rank = f" for rank {rank}" if rank is not None else ""
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or any error raised while the module runs
        raise RuntimeError(
            f"Could not import {profiler_kind} module {module_name!r} for class {class_path!r}{at_rank}: {exc}. {hint}"
        ) from exc
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise RuntimeError(
            f"{profiler_kind} class path {class_path!r}{at_rank} does not resolve to a class "
            f"(got {type(cls).__name__}). {hint}"
        )
    missing = [m for m in required_methods if not callable(getattr(cls, m, None))]
    if missing:
        raise RuntimeError(
            f"{profiler_kind} class {class_path!r}{at_rank} is missing required method(s): {', '.join(missing)}"
        )
    return cls


def load_profiler(
    *,
    env_var: str,
    profiler_kind: str,
    required_methods: Sequence[str],
    install_environment: str,
    rank: int,
    environ: Mapping[str, str] | None = None,
) -> Any | None:
    """Build the plugin named by ``environ[env_var]`` as ``cls(rank=rank)``, or ``None``.

    ``environ`` defaults to ``os.environ``. Unset or empty imports nothing.
    """
    env = os.environ if environ is None else environ
    class_path = env.get(env_var, "")
    if not class_path:
        return None
    cls = resolve_profiler_class(
        class_path,
        profiler_kind=profiler_kind,
        required_methods=required_methods,
        install_environment=install_environment,
        rank=rank,
        env_var=env_var,
    )
    try:
        return cls(rank=rank)
    except Exception as exc:
        raise RuntimeError(
            f"Failed to initialize {profiler_kind} {class_path!r} for rank {rank}: {exc!r}. "
            f"Check its configuration in the {install_environment}."
        ) from exc


def load_policy_profiler(*, rank: int, environ: Mapping[str, str] | None = None) -> PolicyProfiler | None:
    """The policy profiler selected by ``NRL_POLICY_PROFILER_CLASS`` (global training rank)."""
    return load_profiler(
        env_var=POLICY_PROFILER_ENV,
        profiler_kind="policy profiler",
        required_methods=POLICY_PROFILER_METHODS,
        install_environment=POLICY_INSTALL_ENVIRONMENT,
        rank=rank,
        environ=environ,
    )


def load_rollout_profiler(*, rank: int, environ: Mapping[str, str] | None = None) -> RolloutProfiler | None:
    """The rollout profiler selected by ``NRL_ROLLOUT_PROFILER_CLASS`` (dense rollout rank)."""
    return load_profiler(
        env_var=ROLLOUT_PROFILER_ENV,
        profiler_kind="rollout profiler",
        required_methods=ROLLOUT_PROFILER_METHODS,
        install_environment=ROLLOUT_INSTALL_ENVIRONMENT,
        rank=rank,
        environ=environ,
    )
