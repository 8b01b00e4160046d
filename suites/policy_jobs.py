"""Jobs run on every rank of a policy world spawned by `suites.local_world.spawn_world`
(which builds the engine the spec selects) by the backend tests: `curve_job` (the
backend-vs-native comparison: megatron and dtensor), `lora_job` (dtensor's LoRA check)
and `parity_job` (monolithic vs split train steps, the layer-level parity tests).
Test code: the backends' packages hold none of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.parallel.data import shard_for_dp
from harness.spec.typed import as_workload
from suites.local_world import checksums


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


def lora_job(engine, batch: Mapping[str, torch.Tensor], steps: int) -> dict[str, Any]:
    """`steps` monolithic steps with LoRA on; returns (rank 0; {} elsewhere) the
    full base weights before and after, the full adapters after, the merged refit
    export after, the trained names and the step metrics."""
    shard = shard_for_dp(batch, as_workload(engine.spec).policy.dp, engine.coords["dp"])
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


def export_job(engine, batch: Mapping[str, torch.Tensor], steps: int) -> dict[str, Any]:
    """`steps` monolithic steps, then the refit export twice: ``hf_state_dict()`` (the one-gather
    export on the CPU) and every parameter's own ``full_tensor()`` (``_full``). Rank 0 only."""
    from harness.policy.dtensor.engine import hf_name

    shard = shard_for_dp(batch, as_workload(engine.spec).policy.dp, engine.coords["dp"])
    for _ in range(steps):
        engine.train(shard)
    exported = engine.hf_state_dict()
    exported_again = engine.hf_state_dict()
    one_by_one = {hf_name(n): engine._full(n) for n in engine.params}
    if engine.rank != 0:
        return {}
    return {"exported": exported, "again": exported_again, "one_by_one": one_by_one,
            "flat": type(engine._flat).__name__}


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


def _count_schedules(engine) -> list[int]:
    """Wraps the megatron engine's ``_schedule`` so every forward schedule it runs appends to the
    returned list (``len`` is the count so far)."""
    runs: list[int] = []
    schedule = engine._schedule

    def counted(*args, **kwargs):
        runs.append(1)
        return schedule(*args, **kwargs)

    engine._schedule = counted
    return runs


def reference_shortcut_job(engine, batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The megatron engine's untrained reference shortcut against its weight-swap path, with
    a count of the forward schedules each call ran: logprobs, reference (shortcut), reference
    (cache dropped: swap), one train step, logprobs and reference again (swap)."""
    runs = _count_schedules(engine)
    out: dict[str, Any] = {"logprobs": engine.get_logprobs(batch)}
    n0 = len(runs)
    out["fast"] = engine.get_reference_logprobs(batch)
    out["fast_runs"] = len(runs) - n0
    engine._untrained_logprobs = None
    n1 = len(runs)
    out["swapped"] = engine.get_reference_logprobs(batch)
    out["swapped_runs"] = len(runs) - n1
    engine.train(batch)
    out["trained"] = engine.get_logprobs(batch)
    n2 = len(runs)
    out["trained_reference"] = engine.get_reference_logprobs(batch)
    out["trained_reference_runs"] = len(runs) - n2
    return out


def warm_forward_job(engine, batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The megatron engine's start-up warm forward between two logprobs calls: the logprobs
    before and after, whether the untrained-logprobs cache is the same object, schedules run."""
    runs = _count_schedules(engine)
    before = engine.get_logprobs(batch)
    cache = engine._untrained_logprobs
    n0 = len(runs)
    engine.warm_forward()
    out = {"before": before, "warm_runs": len(runs) - n0, "cache_kept": engine._untrained_logprobs is cache}
    out["after"] = engine.get_logprobs(batch)
    return out


def grouped_experts_job(engine, batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """One megatron ``SequentialMLP`` of a CPU engine (megatron's per-expert loop) against
    ``grouped_experts``' two grouped GEMMs over the same parameters (torch's CPU
    ``_grouped_mm``): outputs and every expert's weight gradient, for routed rows with one
    expert left without tokens; plus what ``install`` does on the CPU (the loop stays)."""
    from harness.policy.megatron import grouped_experts

    module = engine.model.decoder.layers[0].mlp.experts
    hidden = module.config.hidden_size
    gen = torch.Generator().manual_seed(7)
    counts = torch.tensor([3, 0, 5] + [2] * (module.num_local_experts - 3))
    x = torch.randn(int(counts.sum()), hidden, generator=gen)
    probs = torch.rand(x.shape[0], generator=gen)

    def run(fn):
        module.zero_grad(set_to_none=True)
        out = fn()
        out.square().sum().backward()
        grads = [p.grad.clone() for e in module.local_experts for p in (e.linear_fc1.weight, e.linear_fc2.weight)]
        return out.detach(), grads

    loop_out, loop_grads = run(lambda: type(module).forward(module, x, counts, probs)[0])
    grouped_out, grouped_grads = run(
        lambda: grouped_experts.grouped_swiglu_scaled(x, *grouped_experts.stack_fc(module), counts, probs))
    installed = grouped_experts.install(engine.model)
    routed_out, _ = run(lambda: module(x, counts, probs)[0])
    module.zero_grad(set_to_none=True)
    return {"unsupported": grouped_experts.unsupported(module), "loop": loop_out, "grouped": grouped_out,
            "loop_grads": loop_grads, "grouped_grads": grouped_grads, "installed": installed,
            "routed_on_cpu": routed_out, "experts": module.num_local_experts,
            "layers": len(engine.model.decoder.layers)}
