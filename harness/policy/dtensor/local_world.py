"""Jobs for worlds spawned by `harness.policy.local_world.spawn_world` on the
dtensor backend (tests): the LoRA check (`lora_job`). The parity job is the
megatron one (`harness.policy.megatron.local_world.curve_job`), backend-neutral."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.policy.local_world import shard_for_dp


def lora_job(engine, batch: Mapping[str, torch.Tensor], steps: int) -> dict[str, Any]:
    """`steps` monolithic steps with LoRA on; returns (rank 0; {} elsewhere) the
    full base weights before and after, the full adapters after, the merged refit
    export after, the trained names and the step metrics."""
    p = engine.spec["policy"]
    shard = shard_for_dp(batch, p["dp"], engine.coords["dp"])
    base_names = [n for n in engine.params if ".lora_" not in n]
    before = {n: engine._full(n) for n in base_names}
    metrics = [engine.train(shard) for _ in range(steps)]
    after = {n: engine._full(n) for n in base_names}
    adapters = {n: engine._full(n) for n in engine.params if ".lora_" in n}
    exported = engine.hf_state_dict()
    trained = [n for n, _ in engine.named]
    optimized = sum(len(g["params"]) for g in engine.optimizer.param_groups)
    if engine.rank != 0:
        return {}
    return {"before": before, "after": after, "adapters": adapters, "exported": exported, "trained": trained,
            "optimized": optimized, "metrics": metrics}
