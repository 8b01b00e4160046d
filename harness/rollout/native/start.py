"""How the native engine starts in a ``RolloutWorker`` (``rollout.backend: native``):
the ``start`` target of ``harness.registry.rollout`` (signature ``StartEngine``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.spec.typed import Workload


def start_engine(spec: Workload, *, in_actor: bool, profiler_rank: int, rank_prefix: int, label: str,
                 run_dir: str, engine_index: int, env_vars: Mapping[str, str] | None) -> Any:
    """``spec``: the plan's typed workload (a value, as the worker received it).
    In the actor: an ``EngineWorker`` (profiler rank ``profiler_rank``). Otherwise one
    internal engine process per ``rollout.tp`` rank (``EngineProcesses``, profiler ranks
    ``rank_prefix + r``), started with this process's environment."""
    if in_actor:
        from harness.rollout.engine_worker import EngineWorker

        return EngineWorker(spec, profiler_rank=profiler_rank)
    from harness.rollout.engine_procs import EngineProcesses

    return EngineProcesses.start(spec, tp_size=spec.rollout.tp, rank_prefix=rank_prefix, label=label,
                                 env=dict(os.environ))
