"""The backend seams: one registry module per role, keyed by the spec's backend name.

* :mod:`harness.registry.policy` -- ``policy.backend`` (native, megatron, dtensor) ->
  the policy engine class, and the :class:`~harness.registry.policy.PolicyEngine` role;
* :mod:`harness.registry.rollout` -- ``rollout.backend`` (native, vllm, sglang) -> how
  the engine starts inside a ``RolloutWorker``, and the engine worker / engine
  processes / rollout engine roles;
* :mod:`harness.registry.trainer` -- ``grpo.trainer`` (sync, dataplane, streaming) ->
  the trainer class, and the :class:`~harness.registry.trainer.Trainer` role.

Each entry is a frozen record of what the rest of the harness needs to know about
a backend (which package it needs, which spec values it fixes, whether it may run in
warm processes, ...) plus ``"module:attr"`` targets imported only when a run selects
the backend: these modules import nothing but the standard library, so the gate half
(spec validation, the pytest plugin) reads them without torch, Ray, megatron-core or
vLLM. The roles are :class:`typing.Protocol` classes; the implementations satisfy
them structurally (``suites/unit/test_registries.py``).

Selecting a backend anywhere else (a compare against a backend-name string) is
refused by ``suites/unit/test_import_graph.py``.
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
