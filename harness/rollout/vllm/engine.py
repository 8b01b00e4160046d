"""The vLLM engine behind ``RolloutWorker`` (``rollout.backend: vllm``).

Two owners, chosen by the profiler placement (docs/vllm.md):

* ``VllmEngineWorker`` -- sync engine with ``rollout.tp == 1``: ``vllm.LLM``
  runs *in the actor process* (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``uni``
  executor), so the rollout profiler built here (rank ``RANK``) observes the
  model's work. It has the ``EngineWorker`` method surface (the actor's
  ``_local`` slot). The init window opens before ``LLM(...)`` and stays open
  through warm-up; the actor closes it with ``end_engine_initialization()``.
* ``VllmEngineProcesses`` -- ``rollout.tp > 1`` or ``rollout.async``: vLLM
  runs its workers in processes of its own (``mp`` executor; an async engine's
  core always runs in its own process). With a profiler configured the
  worker class is substituted (``profiling_worker``) and every internal
  worker builds its own profiler; the lifecycle is fanned out with
  ``collective_rpc``. It has the ``EngineProcesses`` surface (``call`` returns
  one value per internal rank, ``call_each`` takes per-rank kwargs, ``pids``,
  ``stop``), the actor's ``_procs`` slot.

Both start from the spec's step-0 weights written as an HF directory under
the run dir, generate with token-id prompts (``translate``), and refit through
the worker extension (``extension``) over the native bucket streams.

The code: ``config`` (spec to vLLM arguments and environment), ``llm``
(``VllmEngine``, the wrapped ``LLM`` / ``AsyncLLM``) and this module (the two
owners); the configuration names and ``VllmEngine`` are re-exported here, the
import path callers and the registries use.

Before any engine is created: vLLM must be importable (``require_vllm``), a
custom ``rollout.worker_cls`` is refused (``resolve_worker_cls``), and the
actor has already applied the PP = 1 / EP = 1 topology gate.

Determinism: fp32, ``enforce_eager``, prefix caching off, one OpenMP thread
per worker (``VLLM_CPU_OMP_THREADS_BIND=nobind`` at TP 1, one core per rank
beyond), a seed per request. Sync batches are scheduled the same way on every
rerun.

On cuda (the official build) the same code runs with the GPU worker class;
the engine gets a bounded share of the GPU (``cuda_memory_kwargs``: it is
colocated with the policy) and ``VLLM_HOST_IP`` defaults to loopback.
"""


from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from harness.plugins.rollout_hooks import RolloutLifecycleRPC
from harness.rollout.vllm import require_vllm
from harness.rollout.vllm.config import (
    EXTENSION_CLS,
    GPU_MEMORY_UTILIZATION_ENV,
    KV_CACHE_BYTES_ENV,
    cold_cache_env,
    cuda_memory_kwargs,
    engine_env,
    engine_kwargs,
    resolve_worker_cls,
    write_initial_model,
)
from harness.rollout.vllm.llm import VllmEngine
from harness.rollout.vllm.weights import state_dict_info, unpack_state
from harness.spec.typed import as_workload

__all__ = [
    "EXTENSION_CLS",
    "GPU_MEMORY_UTILIZATION_ENV",
    "KV_CACHE_BYTES_ENV",
    "WARMUP_REQUEST",
    "VllmEngine",
    "VllmEngineProcesses",
    "VllmEngineWorker",
    "cold_cache_env",
    "cuda_memory_kwargs",
    "engine_env",
    "engine_kwargs",
    "resolve_worker_cls",
    "write_initial_model",
]

WARMUP_REQUEST = {
    "request_id": "__warmup__", "prompt_ids": [0], "max_new_tokens": 1, "seed": 0, "temperature": 0.0, "top_p": 1.0,
}

# -- in-actor owner (sync, TP = 1) --------------------------------------------------------------
class VllmEngineWorker(RolloutLifecycleRPC):
    """Sync TP=1 vLLM engine in the actor process, with the ``EngineWorker`` surface."""

    def __init__(self, spec: Mapping[str, Any], *, profiler_rank: int, work_dir: str,
                 profiler_class_path: str | None) -> None:
        from harness.plugins.loader import load_rollout_profiler
        from harness.plugins.rollout_hooks import RolloutProfilerHooks

        spec = as_workload(spec)
        worker_cls = resolve_worker_cls(spec, profiler_class_path)  # refuses custom classes
        require_vllm()
        self.spec = spec
        self.hooks = RolloutProfilerHooks(load_rollout_profiler(rank=profiler_rank))
        with self.hooks.engine_init_or_close("vLLM engine"):
            model_dir = write_initial_model(spec, os.path.join(work_dir, "model"))
            self.engine = VllmEngine(spec, model_dir, is_async=False, in_process=True, worker_cls=worker_cls,
                                     profiler_class_path=None, rank_prefix=profiler_rank)
            self.engine.generate([WARMUP_REQUEST], 0)

    # lifecycle: RolloutLifecycleRPC
    def engine_pids(self) -> list[int]:
        return list(self.engine.rpc("harness_pid"))

    # generation and weights
    def generate(self, requests: list[dict]) -> list[dict]:
        return self.engine.generate(requests, self.weight_version())

    def weight_version(self) -> int:
        return int(self.engine.rpc("harness_weight_version")[0])

    def set_weight_version(self, version: int) -> int:
        return int(self.engine.rpc("harness_set_weight_version", {"version": int(version)})[0])

    def state_dict_info(self) -> dict:
        return state_dict_info(self.engine.model)

    def state_dict(self) -> dict:
        return unpack_state(self.engine.rpc("harness_state_dict")[0])

    def receive_weights_zmq(self, *, address: str, timeout_ms: int) -> int:
        return int(self.engine.rpc("harness_receive_weights_zmq",
                                   {"per_rank": [{"address": address, "timeout_ms": int(timeout_ms)}]})[0])

    def receive_weights_broadcast(self, **kw: Any) -> int:
        return int(self.engine.rpc("harness_receive_weights_broadcast", {"per_rank": [dict(kw)]})[0])

    def side_groups(self) -> list[dict]:
        if self.engine.llm is None:
            return []
        return list(self.engine.rpc("harness_side_groups")[0])

    def close_side_groups(self) -> None:
        if self.engine.llm is not None:
            self.engine.rpc("harness_close_side_groups")

    def shutdown_engine(self) -> None:
        self.engine.shutdown()


# -- internal-worker owner (TP > 1 or async) --------------------------------------------------------
_LIFECYCLE = {
    "end_engine_initialization": "end_rollout_profiler_engine_initialization",
    "begin_rollout": "begin_rollout_profile",
    "finish_rollout": "finish_rollout_profile",
    "abort_rollout": "abort_rollout_profile",
    "close_profiler": "close_rollout_profiler",
}
_WEIGHTS = {
    "weight_version": "harness_weight_version",
    "set_weight_version": "harness_set_weight_version",
    "close_side_groups": "harness_close_side_groups",
    "side_groups": "harness_side_groups",
    "pid": "harness_pid",
}
_ARG_NAMES = {
    "generate": ("requests",),
    "begin_rollout": ("step_id",),
    "abort_rollout": ("reason",),
    "set_weight_version": ("version",),
}


class VllmEngineProcesses:
    """vLLM with its own worker processes, with the ``EngineProcesses`` surface."""

    def __init__(self, engine: VllmEngine, label: str, profiled: bool) -> None:
        self.engine = engine
        self.label = label
        self.profiled = profiled
        self.pids = list(engine.rpc("harness_pid"))

    @classmethod
    def start(cls, spec: Mapping[str, Any], *, rank_prefix: int, label: str, work_dir: str,
              profiler_class_path: str | None) -> VllmEngineProcesses:
        """Create the engine (workers open their init windows in their constructors) and warm it up."""
        spec = as_workload(spec)
        worker_cls = resolve_worker_cls(spec, profiler_class_path)  # refuses custom classes
        require_vllm()
        model_dir = write_initial_model(spec, os.path.join(work_dir, "model"))
        engine = VllmEngine(spec, model_dir, is_async=spec.rollout.is_async, in_process=False,
                            worker_cls=worker_cls, profiler_class_path=profiler_class_path, rank_prefix=rank_prefix)
        try:
            engine.generate([WARMUP_REQUEST], 0)
            return cls(engine, label, profiled=bool(profiler_class_path) and worker_cls is not None)
        except BaseException:
            engine.shutdown()
            raise

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method`` on every internal worker (``collective_rpc``); one result per rank."""
        if self.engine.llm is None:
            raise RuntimeError(f"{self.label} is stopped")
        names = _ARG_NAMES.get(method, ())
        if len(args) > len(names):
            raise TypeError(f"{self.label}: {method} takes at most {len(names)} positional argument(s)")
        kwargs = {**dict(zip(names, args)), **kwargs}
        if method == "generate":
            (requests,) = kwargs.values()
            version = int(self.engine.rpc("harness_weight_version")[0])
            return [self.engine.generate(requests, version)] * self.engine.tp
        if method == "state_dict":  # bytes per rank: tensors do not survive vLLM's RPC codec
            return [unpack_state(b) for b in self.engine.rpc("harness_state_dict")]
        if method == "state_dict_info":  # a function of the model block, the same on every rank
            return [state_dict_info(self.engine.model) for _ in range(self.engine.tp)]
        if method in _LIFECYCLE:
            if not self.profiled:
                return [None] * self.engine.tp
            return self.engine.rpc(_LIFECYCLE[method], kwargs)
        if method in _WEIGHTS:
            return self.engine.rpc(_WEIGHTS[method], kwargs)
        raise AttributeError(f"{self.label}: no engine method {method!r}")

    def call_each(self, method: str, per_rank_kwargs: Sequence[Mapping[str, Any]]) -> list[Any]:
        """A refit: every worker takes its own kwargs (``per_rank[rank]``)."""
        if len(per_rank_kwargs) != self.engine.tp:
            raise ValueError(f"{method}: {len(per_rank_kwargs)} kwarg sets for {self.engine.tp} ranks")
        target = {"receive_weights_zmq": "harness_receive_weights_zmq",
                  "receive_weights_broadcast": "harness_receive_weights_broadcast"}.get(method)
        if target is None:
            raise AttributeError(f"{self.label}: no per-rank engine method {method!r}")
        return self.engine.rpc(target, {"per_rank": [dict(kw) for kw in per_rank_kwargs]})

    def stop(self) -> None:
        self.engine.shutdown()
