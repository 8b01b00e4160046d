"""Step time with the built-in trace profilers on vs off, per operator source (CPU, 1 thread).

    python3 benches/plugin_overhead.py [--workload engine|mlp|model] [--sources recordfn,profiler,off]
                                       [--components] [--steps 5] [--blocks 3]

Workloads:

* ``engine`` (default): one "step" is a rollout window around the native
  generation engine of the smoke golden (tiny Qwen3-MoE, 16 requests x 16 new
  tokens: hundreds of thousands of tiny ops), observed by ``TraceRolloutProfiler``.
  This is the shape that made the trace profilers ~80x slower with
  ``torch.profiler`` + ``key_averages()``.
* ``mlp``: seeded training steps of an MLP (``--hidden``, ``--layers``, AdamW)
  through ``PolicyProfilerHooks`` and ``TracePolicyProfiler``.

Each source in ``--sources`` gets its own profiler (``HARNESS_TRACE_OPERATORS``
is read when a profiler is built; collectives use the default method). Arms
run interleaved in blocks to spread machine noise; prints each arm's median
step time and its ratio to the no-plugin arm. Informational only; no verdict.

``--components`` adds arms that each wrap the step in ONE piece of what a
trace profiler does per phase, to find where an overhead comes from:
``c:stash`` (an object in torch's thread-local stash, as the collective
recorder keeps its state), ``c:recorder`` (the collective recorder),
``c:memory`` (peak-memory reset + read), ``c:probe-off`` (a whole
``PhaseProbe`` with operators off, no file), ``c:fsync`` (one trace line
written and fsynced, as every phase end does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from harness.plugins.policy_hooks import PolicyProfilerHooks
from harness.plugins.rollout_hooks import RolloutProfilerHooks
from harness.profiler.trace import TracePolicyProfiler, TraceRolloutProfiler


def mlp_step(hidden: int, layers: int, batch: int) -> Callable[[], object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(hidden, hidden), torch.nn.GELU())])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(batch, hidden)

    def train(data_=data, loss_fn=None, eval_mode=False):  # PolicyWorker.train's signature
        opt.zero_grad(set_to_none=True)
        loss = model(data_).pow(2).mean()
        loss.backward()
        opt.step()
        return float(loss.detach())

    return train


# A medium Qwen3-MoE for GPUs (qwen3_moe_and_parallelism.md 5.2, "tokenizer-free" variant, 8 layers).
MEDIUM = {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 4, "head_dim": 128, "experts": 64, "top_k": 8,
          "moe_intermediate": 384, "vocab": 32768, "rope_theta": 1e6, "max_position": 8192}


def model_step(device: str, batch: int, seq: int, medium: bool) -> Callable[[], object]:
    """Forward + backward + AdamW of the reference Qwen3-MoE (tiny, or medium on a GPU)."""
    from harness.model.config import ModelConfig
    from harness.model.qwen3_moe import build_reference_model

    block = MEDIUM if medium else {"layers": 4, "hidden": 64, "heads": 8, "kv_heads": 2, "head_dim": 16,
                                   "experts": 8, "top_k": 2, "moe_intermediate": 32, "vocab": 256}
    cfg = ModelConfig.from_spec(block)
    model = build_reference_model(cfg, seed=0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab, (batch, seq), generator=torch.Generator().manual_seed(0)).to(device)

    def train(data_=None, loss_fn=None, eval_mode=False):  # PolicyWorker.train's signature
        opt.zero_grad(set_to_none=True)
        loss = -model.logprobs(ids)[:, 1:].mean()
        loss.backward()
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return float(loss.detach())

    return train


def engine_step(requests: int, new_tokens: int) -> Callable[[], object]:
    from harness.rollout.engine import Engine
    from harness.rollout.engine_worker import initial_weights
    from harness.spec import load_spec

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = load_spec(os.path.join(root, "goldens", "qwen3_moe_tiny_smoke", "workload.yaml"), [])
    engine = Engine(spec["model"], initial_weights(spec), max_batch_size=int(spec["rollout"]["max_batch_size"]))
    batch = [
        {"request_id": f"r{i}", "prompt_ids": list(range(3 + i, 15 + i)), "max_new_tokens": new_tokens,
         "seed": i, "temperature": 1.0, "top_p": 1.0}
        for i in range(requests)
    ]
    return lambda: engine.generate(batch)


def make_arm(workload: str, source: str | None, rank: int, step: Callable[[], object]) -> Callable[[], None]:
    """A callable running one observed step (``source=None``: no profiler)."""
    if source is not None:
        os.environ["HARNESS_TRACE_OPERATORS"] = source
    if workload in ("mlp", "model"):
        hooks = PolicyProfilerHooks(None if source is None else TracePolicyProfiler(rank=rank))
        return lambda: hooks.run_train(step) and None
    rhooks = RolloutProfilerHooks(None if source is None else TraceRolloutProfiler(rank=rank))
    with rhooks.engine_init():
        pass  # the engine is shared by all arms and built before them
    counter = iter(range(1, 1 << 30))

    def run() -> None:
        with rhooks.rollout(f"step{next(counter)}/attempt1"):
            step()

    return run


def component_arms(step: Callable[[], object], run_dir: str) -> dict[str, Callable[[], None]]:
    """One arm per piece of a trace profiler's per-phase work (see the module docstring)."""
    from harness.profiler.collectives import CollectiveRecorder
    from harness.profiler.phase import PhaseProbe, ProbeConfig, _cuda_in_use

    def stash() -> None:
        torch._C._stash_obj_in_tls("bench.plugin_overhead", ())
        try:
            step()
        finally:
            remove = getattr(torch._C, "_remove_obj_from_tls", None)  # torch >= 2.12
            if remove is not None:
                remove("bench.plugin_overhead")
            else:
                torch._C._stash_obj_in_tls("bench.plugin_overhead", ())

    def recorder() -> None:
        rec = CollectiveRecorder()
        rec.start()
        try:
            step()
        finally:
            rec.stop()

    def memory() -> None:
        if _cuda_in_use():
            torch.cuda.reset_peak_memory_stats()
        step()
        if _cuda_in_use():
            torch.cuda.max_memory_allocated()

    def probe_off() -> None:
        probe = PhaseProbe(ProbeConfig(operators="off"))
        probe.start()
        try:
            step()
        finally:
            probe.stop()

    fsync_path = os.path.join(run_dir, "fsync-probe.jsonl")

    def fsync() -> None:
        step()
        with open(fsync_path, "a", encoding="utf-8") as fh:  # the trace writer keeps its file open: close enough
            fh.write('{"type": "phase"}\n')
            fh.flush()
            os.fsync(fh.fileno())

    return {"c:stash": stash, "c:recorder": recorder, "c:memory": memory, "c:probe-off": probe_off, "c:fsync": fsync}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("engine", "mlp", "model"), default="engine")
    parser.add_argument("--device", default="cpu", help="cpu | cuda (model workload)")
    parser.add_argument("--medium", action="store_true", help="model workload: the medium config (GPU)")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--sources", default="recordfn,profiler", help="comma list of recordfn, profiler, off")
    parser.add_argument("--components", action="store_true", help="add one arm per piece of the per-phase work")
    parser.add_argument("--steps", type=int, default=5, help="steps per arm per block")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sources = [s for s in args.sources.split(",") if s]
    if args.workload == "mlp":
        step = mlp_step(args.hidden, args.layers, args.batch)
        what = f"MLP {args.layers}x{args.hidden}, batch {args.batch}, AdamW"
    elif args.workload == "model":
        step = model_step(args.device, args.batch, args.seq, args.medium)
        what = (f"Qwen3-MoE {'medium' if args.medium else 'tiny'} fwd+bwd+AdamW on {args.device}, "
                f"batch {args.batch} x seq {args.seq}")
    else:
        step = engine_step(args.requests, args.new_tokens)
        what = f"smoke engine generation, {args.requests} requests x {args.new_tokens} tokens"
    with tempfile.TemporaryDirectory() as run_dir:
        os.environ["HARNESS_TRACE_DIR"] = run_dir
        arms = {"no-plugin": make_arm(args.workload, None, 0, step)}
        for rank, source in enumerate(sources):
            arms[f"ops={source}"] = make_arm(args.workload, source, rank, step)
        if args.components:
            arms.update(component_arms(step, run_dir))
        times: dict[str, list[float]] = {name: [] for name in arms}
        for run in arms.values():
            run()  # warm-up
        for _ in range(args.blocks):
            for name, run in arms.items():
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - t0)
    off = statistics.median(times["no-plugin"])
    from harness.profiler.phase import resolve_probe_config

    probe = resolve_probe_config()
    print(f"workload: {what}; {len(times['no-plugin'])} steps per arm, torch {torch.__version__}, "
          f"collectives method {probe.collectives}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:12s} median {med * 1e3:9.1f} ms   ratio {med / off:6.2f}")


if __name__ == "__main__":
    main()
