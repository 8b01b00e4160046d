"""The substituted vLLM ``worker_cls`` that hosts one rollout profiler per internal worker.

Placement (docs/vllm.md, "Placement"): for ``rollout.tp > 1`` or an async engine the
outer actor does not run the model, so when a rollout profiler is configured
the engine is created with ``worker_cls`` set to one of these classes and
``additional_config["harness_rollout_profiler"] = {"class_path", "rank_prefix"}``.
Every vLLM worker process then builds its own profiler with rank
``rank_prefix + worker rank`` and opens the engine-init window in its
constructor, *before* the device, model and KV cache exist; the owner closes
it after warm-up with ``collective_rpc("end_rollout_profiler_engine_initialization")``
(vLLM's ``post_init``). Lifecycle fan-out: ``begin_rollout_profile``,
``finish_rollout_profile``, ``abort_rollout_profile``, ``close_rollout_profiler``.

Classes (resolved lazily by vLLM through ``module.attribute``):
``RolloutProfilingCPUWorker`` (base ``vllm.v1.worker.cpu_worker.CPUWorker``) and
``RolloutProfilingGPUWorker`` (base ``vllm.v1.worker.gpu_worker.Worker``).
Only these compose with profiling; any other custom ``rollout.worker_cls`` is
refused before the engine is created (``engine.resolve_worker_cls``).
"""

from __future__ import annotations

import os
from typing import Any

PROFILER_CONFIG_KEY = "harness_rollout_profiler"

BASES = {
    "RolloutProfilingCPUWorker": "vllm.v1.worker.cpu_worker.CPUWorker",
    "RolloutProfilingGPUWorker": "vllm.v1.worker.gpu_worker.Worker",
}


def class_path(platform_device: str) -> str:
    """Dotted path of the profiling worker class for ``platform.device``."""
    return f"{__name__}.{'RolloutProfilingCPUWorker' if platform_device == 'cpu' else 'RolloutProfilingGPUWorker'}"


def _make(name: str, base: type) -> type:
    from harness.plugins.loader import ROLLOUT_PROFILER_ENV, load_rollout_profiler
    from harness.plugins.rollout_hooks import (
        RolloutProfilerHooks,
        rollout_profiler_rank,
    )

    def __init__(self, vllm_config, *args: Any, **kwargs: Any) -> None:
        cfg = (vllm_config.additional_config or {}).get(PROFILER_CONFIG_KEY)
        if not isinstance(cfg, dict) or not cfg.get("class_path"):
            raise RuntimeError(f"{name}: vllm additional_config[{PROFILER_CONFIG_KEY!r}] with class_path is missing")
        rank = kwargs["rank"] if "rank" in kwargs else args[1]
        profiler = load_rollout_profiler(rank=rollout_profiler_rank(int(cfg["rank_prefix"]), int(rank)),
                                         environ={ROLLOUT_PROFILER_ENV: cfg["class_path"]})
        self._rollout_profiler_hooks = RolloutProfilerHooks(profiler)
        with self._rollout_profiler_hooks.engine_init_or_close("vLLM worker"):
            base.__init__(self, vllm_config, *args, **kwargs)

    def end_rollout_profiler_engine_initialization(self) -> None:
        self._rollout_profiler_hooks.end_engine_init()

    def begin_rollout_profile(self, step_id: int | str) -> None:
        self._rollout_profiler_hooks.begin_rollout(step_id)

    def finish_rollout_profile(self) -> None:
        self._rollout_profiler_hooks.finish_rollout()

    def abort_rollout_profile(self, reason: str) -> None:
        self._rollout_profiler_hooks.abort_rollout(reason)

    def close_rollout_profiler(self) -> None:
        self._rollout_profiler_hooks.close()

    def rollout_profiler_pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        try:
            self._rollout_profiler_hooks.close()  # idempotent: a no-op after close_rollout_profiler
        finally:
            base.shutdown(self)

    namespace: dict[str, Any] = {
        "__init__": __init__,
        "end_rollout_profiler_engine_initialization": end_rollout_profiler_engine_initialization,
        "begin_rollout_profile": begin_rollout_profile,
        "finish_rollout_profile": finish_rollout_profile,
        "abort_rollout_profile": abort_rollout_profile,
        "close_rollout_profiler": close_rollout_profiler,
        "rollout_profiler_pid": rollout_profiler_pid,
        "shutdown": shutdown,
    }
    namespace["__module__"] = __name__
    namespace["__qualname__"] = name
    namespace["__doc__"] = f"{base.__module__}.{base.__qualname__} with one rollout profiler (see module docstring)."
    return type(name, (base,), namespace)


_CACHE: dict[str, type] = {}


def __getattr__(attr: str) -> type:
    """Build ``RolloutProfilingCPUWorker`` / ``RolloutProfilingGPUWorker`` on first access (imports vLLM)."""
    if attr not in BASES:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    if attr not in _CACHE:
        import importlib

        module, _, cls = BASES[attr].rpartition(".")
        _CACHE[attr] = _make(attr, getattr(importlib.import_module(module), cls))
    return _CACHE[attr]
