"""``policy.backend`` -> the policy engine: the registry and the role's Protocol.

A policy engine is one policy rank's model, optimizer and train step, without
Ray (``PolicyWorker`` wraps it; tests drive it from spawned ranks). The default
process group over the policy world is initialised first
(``harness.policy.distributed.init_distributed``); the engine is then built as
``engine_class(name)(spec, rank, topology=topology)``.

Stdlib only: the engine modules are imported by :func:`engine_class`, never here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from harness.registry import NATIVE_ENV, Requirement, UnknownBackend, WorkerEnv, load_target

if TYPE_CHECKING:
    import torch


@runtime_checkable
class PolicyEngine(Protocol):
    """One policy rank (the methods ``PolicyWorker`` and the test worlds call).

    ``coords`` maps each parallel dimension (tp, pp, cp, dp, ep, edp, ...) to this
    rank's coordinate; ``spec`` is the workload spec the engine was built from.
    The split-step contract (one open step per engine) is ``harness.policy.split_step``."""

    backend: str
    rank: int
    spec: Mapping[str, Any]
    coords: Mapping[str, int]

    def train(self, batch: Mapping[str, torch.Tensor], eval_mode: bool = False) -> dict[str, float]:
        """One optimizer step over this rank's DP shard of a global batch (no step with ``eval_mode``)."""
        ...

    def begin_train_step(self) -> None: ...

    def train_microbatch(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]: ...

    def finish_train_step(self) -> dict[str, float]: ...

    def abort_train_step(self) -> None: ...

    def get_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logprobs ``[B, S]`` of this rank's DP shard on last-stage ranks (empty elsewhere)."""
        ...

    def get_reference_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor: ...

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Full HF-named tensors on policy rank 0 (a collective; other ranks return {})."""
        ...

    def save_checkpoint(self, directory: str) -> None: ...

    def load_checkpoint(self, directory: str) -> None: ...


@dataclass(frozen=True)
class PolicyBackend:
    """One ``policy.backend``: its engine class and what the spec rules and the runner need to know."""

    name: str
    engine: str  # "module:Class", imported by engine_class()
    # Policy fields this backend runs at one value only (spec rules; docs/dtensor.md).
    fixed: Mapping[str, Any] = field(default_factory=dict)
    lora: bool = False  # trains LoRA adapters (policy.lora.enabled)
    distill: bool = False  # may be the student of grpo.trainer: distill (its loss carries the KL term)
    cp_needs_cuda: bool = False  # policy.cp > 1 needs platform.device: cuda (Transformer Engine)
    # Why it runs in fresh worker processes, never the warm pool's ("": it may run warm).
    cold: str = "module-global parallel state"
    # The optional package it needs (None: part of the default install); see harness.spec.backends.
    requires: Requirement | None = None
    # The worker environment its policy ranks run in under --worker-env (harness.workerenv.declare).
    worker_env: WorkerEnv = NATIVE_ENV
    # The fork-server flavour of its fresh ranks (harness.runner.zygote.FLAVOURS): what every rank
    # imports at start-up beyond the zygote's preloads, in a fresh rank's order ("module" or
    # "module:function", called with no arguments). Empty: its ranks fork from the plain server.
    flavour: tuple[str, ...] = ()


POLICY_BACKENDS: dict[str, PolicyBackend] = {b.name: b for b in (
    PolicyBackend("native", "harness.policy.native.engine:NativePolicyEngine", cold="", distill=True),
    PolicyBackend("megatron", "harness.policy.megatron.engine:MegatronPolicyEngine", cp_needs_cuda=True,
                  requires=Requirement("megatron.core", "megatron-core",
                                       "pip install 'grpo-golden-harness[megatron]' (in a checkout: pip install -e "
                                       "'.[megatron]')", "megatron"),
                  worker_env=WorkerEnv("megatron", ("workload", "megatron"),
                                       ("harness", "torch", "ray", "megatron.core"), "megatron-core policy workers"),
                  flavour=("harness.parallel.settle:install", "harness.policy.megatron.engine",
                           "harness.policy.megatron.compat:import_megatron")),
    PolicyBackend("dtensor", "harness.policy.dtensor.engine:DTensorPolicyEngine",
                  fixed={"pp": 1, "cp": 1, "ep": 1, "etp": 1, "sp": False}, lora=True,
                  worker_env=WorkerEnv("dtensor", ("workload",), ("harness", "torch", "ray", "torch.distributed.fsdp"),
                                       "DTensor (FSDP2 + TP) policy workers: nothing beyond torch on CPU "
                                       "(docs/dtensor.md)", smoke_overrides=("policy.sp=false",)),
                  flavour=("harness.parallel.settle:install", "harness.policy.dtensor.engine")),
)}


def policy_backend(name: str) -> PolicyBackend:
    """The registry entry for ``policy.backend`` ``name``; :class:`UnknownBackend` otherwise."""
    try:
        return POLICY_BACKENDS[name]
    except (KeyError, TypeError):
        raise UnknownBackend("policy.backend", name, list(POLICY_BACKENDS)) from None


def engine_class(name: str) -> type[PolicyEngine]:
    """The engine class of ``policy.backend`` ``name`` (its module is imported now)."""
    return load_target(policy_backend(name).engine)


def create_engine(spec: Any, rank: int, *, topology: Any = None) -> PolicyEngine:
    """The engine ``spec``'s ``policy.backend`` selects, built for ``rank`` (the default
    process group over the policy world must exist). ``spec``: the loaded ``Workload``
    (``harness.spec.typed``; a caller holding a plain spec dict converts it with
    ``as_workload`` first: this module imports nothing of the spec package, which
    generates its schema's enums from these records)."""
    if not hasattr(spec, "policy"):
        raise TypeError(f"create_engine takes a loaded Workload (harness.spec.typed.as_workload), "
                        f"not {type(spec).__name__}")
    return engine_class(spec.policy.backend)(spec, rank, topology=topology)
