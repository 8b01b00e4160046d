"""Optional backend packages a workload needs, checked before anything starts.

``policy.backend: megatron`` needs megatron-core, ``rollout.backend: vllm`` needs
vLLM and ``rollout.backend: sglang`` needs sglang (0.5.17, cuda only: the spec rules
refuse it on another device, docs/sglang.md); none is part of the default install. A
backend whose record carries ``unsupported`` is refused whether or not it is installed.
``require_backends(spec)`` raises ``BackendMissing`` (a ``SpecError``: the ``golden`` command exits 2, the
pytest plugin fails the workload's tests) naming the field, the package and the
install command, before Ray or any worker starts: a missing package is a usage
problem, not a worker that "died during ready".

The backends and what they need are declared by the registries
(``harness.registry.policy``, ``harness.registry.rollout``: ``requires``,
``unsupported``); ``OPTIONAL_BACKENDS`` is read from them.

Stdlib only (gate half): presence is decided with ``importlib.util.find_spec``
on the top-level package and a path search for the submodule, so nothing of the
backend (or torch) is imported.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.registry.policy import POLICY_BACKENDS
from harness.registry.rollout import ROLLOUT_BACKENDS
from harness.spec.errors import SpecError


@dataclass(frozen=True)
class Backend:
    """One optional backend: the spec field and value that select it, and what it needs."""

    field: str  # dotted spec path, e.g. "policy.backend"
    value: str  # the value that selects it, e.g. "megatron"
    module: str  # the import name that must resolve, e.g. "megatron.core"
    package: str  # the distribution a user installs
    install: str  # the command that installs it
    marker: str  # the pytest marker the plugin puts on the workload's tests
    unsupported: str = ""  # non-empty: refused even when installed, with this reason


def _optional_backends() -> tuple[Backend, ...]:
    """Every registered backend that needs a package outside the default install
    (``requires`` in ``harness.registry.policy`` / ``harness.registry.rollout``)."""
    out = []
    for role, registry in (("policy", POLICY_BACKENDS), ("rollout", ROLLOUT_BACKENDS)):
        for entry in registry.values():
            if entry.requires is not None:
                need = entry.requires
                out.append(Backend(f"{role}.backend", entry.name, need.module, need.package, need.install,
                                   need.marker, getattr(entry, "unsupported", "")))
    return tuple(out)


OPTIONAL_BACKENDS: tuple[Backend, ...] = _optional_backends()


class BackendMissing(SpecError):
    """The spec selects a backend whose package is not installed."""


def module_available(name: str) -> bool:
    """True when ``name`` (dotted) resolves to a regular module or package, without importing it.

    A bare folder of that name on ``sys.path`` (a namespace package with no
    code) does not count for the last component."""
    top, _, rest = name.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # a broken parent, or sys.modules[top] set to None
        return False
    if spec is None:
        return False
    for part in rest.split(".") if rest else ():
        locations = spec.submodule_search_locations
        if not locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
        if spec is None:
            return False
    return spec.origin is not None and spec.origin != "namespace"


def _field(spec: Mapping[str, Any], dotted: str) -> object:
    value: object = spec
    for key in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def backends_of(spec: dict) -> list[Backend]:
    """The optional backends ``spec`` selects (installed or not)."""
    return [b for b in OPTIONAL_BACKENDS if _field(spec, b.field) == b.value]


def missing_backends(spec: dict) -> list[Backend]:
    """The optional backends ``spec`` selects whose package is not installed here. A backend whose
    workers run in a built worker environment (``--worker-env``, docs/worker-envs.md) is that
    environment's business: its build imported the package, and the run refuses it if it is unusable."""
    from harness.workerenv.select import in_worker_env

    return [b for b in backends_of(spec)
            if not in_worker_env(b.field.split(".", 1)[0]) and not module_available(b.module)]


def require_backends(spec: dict, source: str | None = None) -> None:
    """Raise ``BackendMissing`` for the first selected backend that is unsupported or not installed."""
    for backend in backends_of(spec):
        if backend.unsupported:
            raise BackendMissing(backend.field, f"{backend.value} is not supported: {backend.unsupported}",
                                 source=source or spec.get("name"))
    for backend in missing_backends(spec):
        raise BackendMissing(
            backend.field,
            f"{backend.value} needs the package {backend.package} (import {backend.module}), which is not "
            f"installed here; install it with: {backend.install}",
            source=source or spec.get("name"),
        )
