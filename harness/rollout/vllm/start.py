"""How vLLM starts in a ``RolloutWorker`` (``rollout.backend: vllm``, docs/vllm.md): the
``start`` target of ``harness.registry.rollout`` (signature ``StartEngine``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from harness.plugins.rollout_hooks import rollout_profiler_class_path
from harness.spec.typed import as_workload


def start_engine(spec: Mapping[str, Any], *, in_actor: bool, profiler_rank: int, rank_prefix: int, label: str,
                 run_dir: str, engine_index: int, env_vars: Mapping[str, str] | None) -> Any:
    """The same two placements as the native engine: vLLM in the actor for a sync TP=1
    engine (``VllmEngineWorker``), else vLLM's own worker processes (``VllmEngineProcesses``).
    The model directory and caches live under ``<run_dir>/vllm/engine<engine_index>``."""
    from harness.rollout.vllm.engine import VllmEngineProcesses, VllmEngineWorker

    spec = as_workload(spec).to_dict()  # the vLLM backend reads (and serialises) a plain spec dict
    profiler = rollout_profiler_class_path(env_vars)
    work_dir = os.path.join(run_dir, "vllm", f"engine{engine_index}")
    if in_actor:
        return VllmEngineWorker(spec, profiler_rank=profiler_rank, work_dir=work_dir, profiler_class_path=profiler)
    return VllmEngineProcesses.start(spec, rank_prefix=rank_prefix, label=label, work_dir=work_dir,
                                     profiler_class_path=profiler)
