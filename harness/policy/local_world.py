"""Run a policy world in plain `torch.multiprocessing` processes (no Ray).

Used by the layer-level parity tests and the step benchmark: `spawn_world`
starts `world` spawned ranks, each initialises gloo, builds
the engine `spec.policy.backend` selects (`create_engine`) and calls `fn(engine, *args)`; results come back per rank.
`synthetic_batch` builds a deterministic GRPO train batch for a spec.
"""

from __future__ import annotations

import copy
import io
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.multiprocessing as mp

from harness import ops
from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.parallel.rendezvous import HeldStore
from harness.spec.typed import as_workload


def with_layout(spec: Mapping[str, Any], **policy: Any) -> dict[str, Any]:
    """A copy of `spec` with policy fields replaced (e.g. tp=2, pp=2)."""
    out = copy.deepcopy(dict(spec))
    out["policy"] = {**out["policy"], **policy}
    return out


def world_size(spec: Mapping[str, Any]) -> int:
    return as_workload(spec).policy.world_size


def _rank_main(rank: int, world: int, port: int, spec, fn, args, queue) -> None:
    import torch.distributed as dist

    from harness.policy.distributed import init_distributed
    from harness.registry.policy import create_engine

    try:
        init_distributed(rank, world, "127.0.0.1", port)
        engine = create_engine(spec, rank)  # the backend spec.policy.backend selects
        result = fn(engine, *args)
        from harness.parallel import settle

        if settle.stats["timeouts"]:  # a collective kept a tensor: autograd's choices could vary
            raise RuntimeError(f"rank {rank}: {settle.stats['timeouts']} collective(s) kept a reference to "
                               f"their tensors past {settle.TIMEOUT_S} s (harness.parallel.settle)")
        buf = io.BytesIO()  # plain bytes: shared-memory tensors would die with this process
        torch.save(result, buf)
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        queue.put((rank, "error", f"{exc!r}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn_world(spec: Mapping[str, Any], fn: Callable[..., Any], *args: Any, timeout_s: float = 120.0) -> list[Any]:
    """Run `fn(engine, *args)` on every rank; returns results indexed by rank.
    `fn` must be a module-level function (it is pickled by reference).
    Raises RuntimeError naming the first failed rank."""
    world = world_size(spec)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    held = HeldStore()
    port = held.port
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
            if errors:
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 1)
            if p.is_alive():
                p.kill()
                p.join()
        held.close()
    if errors:
        rank = min(errors)
        raise RuntimeError(f"policy rank {rank} failed: {errors[rank]}")
    return [results[r] for r in range(world)]


def synthetic_batch(spec: Mapping[str, Any], batch_size: int, seed: int) -> dict[str, torch.Tensor]:
    """A deterministic GRPO train batch `[batch_size, seq_len]`: random prompt
    and response tokens, right padding, a token mask on the response,
    advantages per sample, and prev/generation/reference logprobs from the
    initial reference model (so ratios start at 1)."""
    spec = as_workload(spec)
    cfg = ModelConfig.from_spec(spec.model)
    seq = spec.policy.seq_len
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab, (batch_size, seq), generator=g)
    prompt = torch.randint(seq // 8, seq // 4, (batch_size,), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (batch_size,), generator=g)
    pos = torch.arange(seq).unsqueeze(0)
    token_mask = ((pos >= prompt[:, None]) & (pos < lengths[:, None])).to(torch.float32)
    ids = torch.where(pos < lengths[:, None], ids, torch.zeros_like(ids))
    adv = torch.randn(batch_size, generator=g)
    with torch.no_grad():
        ref = build_reference_model(cfg, spec.seed)
        lp = ops.token_logprobs(ref(ids)[0], ids)
    return {
        "input_ids": ids,
        "input_lengths": lengths,
        "token_mask": token_mask,
        "sample_mask": torch.ones(batch_size),
        "advantages": adv[:, None].expand(batch_size, seq).contiguous(),
        "prev_logprobs": lp.clone(),
        "generation_logprobs": lp.clone(),
        "reference_policy_logprobs": lp.clone(),
    }


def shard_for_dp(batch: Mapping[str, torch.Tensor], dp: int, dp_rank: int) -> dict[str, torch.Tensor]:
    """Contiguous DP shard of every tensor along dim 0."""
    b = batch["input_ids"].shape[0]
    if b % dp:
        raise ValueError(f"batch of {b} samples does not split over policy.dp={dp}")
    n = b // dp
    return {k: v[dp_rank * n : (dp_rank + 1) * n] for k, v in batch.items()}


def checksums(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[float, float, float]]:
    """{name: (sum, sum of squares, sum of |x|)} in float64."""
    return {
        k: (float(v.double().sum()), float(v.double().pow(2).sum()), float(v.double().abs().sum()))
        for k, v in state.items()
    }


def parity_job(engine, batch: Mapping[str, torch.Tensor], steps: int, chunks: int, ckpt_dir: str) -> dict[str, Any]:
    """Run `steps` monolithic steps, restore the initial checkpoint, then the
    same steps through the split API (`chunks` train_microbatch calls each).
    Returns per-step metrics of both paths (last-stage ranks) and parameter
    checksums after each path (rank 0)."""
    shard = shard_for_dp(batch, as_workload(engine.spec).policy.dp, engine.coords["dp"])
    engine.save_checkpoint(ckpt_dir)
    mono = [engine.train(shard) for _ in range(steps)]
    mono_sums = checksums(engine.hf_state_dict())  # collective; {} except on rank 0
    logprobs = engine.get_logprobs(shard)
    engine.load_checkpoint(ckpt_dir)
    split = []
    n = shard["input_ids"].shape[0] // chunks
    for _ in range(steps):
        engine.begin_train_step()
        for c in range(chunks):
            engine.train_microbatch({k: v[c * n : (c + 1) * n] for k, v in shard.items()})
        split.append(engine.finish_train_step())
    split_sums = checksums(engine.hf_state_dict())
    return {"mono": mono, "split": split, "mono_sums": mono_sums, "split_sums": split_sums,
            "logprobs": logprobs, "coords": dict(engine.coords), "is_last": engine.is_last}
