"""How SGLang starts in a ``RolloutWorker`` (``rollout.backend: sglang``, docs/sglang.md):
the ``start`` target of ``harness.registry.rollout`` (signature ``StartEngine``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def start_engine(spec: Mapping[str, Any], *, in_actor: bool, profiler_rank: int, rank_prefix: int, label: str,
                 run_dir: str, engine_index: int, env_vars: Mapping[str, str] | None) -> Any:
    """The engine in the actor (sync, TP 1): an ``SGLangEngineWorker`` whose model directory
    lives under ``<run_dir>/sglang/engine<engine_index>``. SGLang's own multi-process TP and
    its async engine are not driven yet: refused, naming the fields."""
    if not in_actor:
        raise ValueError(f"{label}: rollout.backend sglang runs only as a sync engine with rollout.tp 1 "
                         "(in the rollout actor); rollout.tp > 1 and rollout.async are not supported yet")
    from harness.rollout.sglang.worker import SGLangEngineWorker

    return SGLangEngineWorker(spec, profiler_rank=profiler_rank,
                              work_dir=os.path.join(run_dir, "sglang", f"engine{engine_index}"))
