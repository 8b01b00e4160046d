"""The megatron-vs-native comparison job, run on every rank of a world spawned by
`harness.policy.local_world.spawn_world` (which builds the engine the spec selects)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.policy.local_world import checksums, shard_for_dp
from harness.spec.typed import as_workload


def curve_job(engine, batch: Mapping[str, torch.Tensor], steps: int, ckpt_dir: str) -> dict[str, Any]:
    """Initial (reference) logprobs, `steps` monolithic steps, final full-weight
    checksums; then restore the initial checkpoint and run the same steps through
    the split API (2 chunks). Returns everything on every rank ({} sums off rank 0)."""
    shard = shard_for_dp(batch, as_workload(engine.spec).policy.dp, engine.coords["dp"])
    init_sums = checksums(engine.hf_state_dict())
    logprobs0 = engine.get_logprobs(shard)
    engine.save_checkpoint(ckpt_dir)
    mono = [engine.train(shard) for _ in range(steps)]
    mono_sums = checksums(engine.hf_state_dict())
    ref_lp = engine.get_reference_logprobs(shard)
    engine.load_checkpoint(ckpt_dir)
    split = []
    n = shard["input_ids"].shape[0] // 2
    for _ in range(steps):
        engine.begin_train_step()
        for c in range(2):
            engine.train_microbatch({k: v[c * n : (c + 1) * n] for k, v in shard.items()})
        split.append(engine.finish_train_step())
    return {"logprobs0": logprobs0, "ref_logprobs": ref_lp, "mono": mono, "split": split,
            "init_sums": init_sums, "mono_sums": mono_sums, "coords": dict(engine.coords)}
