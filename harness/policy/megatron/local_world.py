"""Spawn a policy world in plain processes with the engine the spec selects
(`harness.policy.engine.create_engine`), for the megatron-vs-native tests."""

from __future__ import annotations

import io
import traceback
from typing import Any, Callable, Mapping

import torch
import torch.multiprocessing as mp

from harness.policy.local_world import checksums, free_port, shard_for_dp, world_size


def _rank_main(rank: int, world: int, port: int, spec, fn, args, queue) -> None:
    import torch.distributed as dist

    from harness.policy.engine import create_engine, init_distributed

    try:
        init_distributed(rank, world, "127.0.0.1", port)
        engine = create_engine(spec, rank)
        buf = io.BytesIO()
        torch.save(fn(engine, *args), buf)
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException as exc:  # report, never hang the parent
        queue.put((rank, "error", f"{exc!r}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn_engines(spec: Mapping[str, Any], fn: Callable[..., Any], *args: Any, timeout_s: float = 240.0) -> list[Any]:
    world = world_size(spec)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, spec, fn, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        for _ in range(world):
            rank, status, payload = queue.get(timeout=timeout_s)
            if status == "ok":
                results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors[rank] = payload
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 1)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        rank = min(errors)
        raise RuntimeError(f"policy rank {rank} failed: {errors[rank]}")
    return [results[r] for r in range(world)]


def curve_job(engine, batch: Mapping[str, torch.Tensor], steps: int, ckpt_dir: str) -> dict[str, Any]:
    """Initial (reference) logprobs, `steps` monolithic steps, final full-weight
    checksums; then restore the initial checkpoint and run the same steps through
    the split API (2 chunks). Returns everything on every rank ({} sums off rank 0)."""
    p = engine.spec["policy"]
    shard = shard_for_dp(batch, p["dp"], engine.coords["dp"])
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
