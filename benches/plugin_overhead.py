"""Step time with the built-in trace profilers on vs off, per operator source (CPU, 1 thread).

    python3 benches/plugin_overhead.py [--workload engine|mlp] [--sources recordfn,profiler,off]
                                       [--steps 5] [--blocks 3]

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
step time and its ratio to the plugin-off arm. Informational only; no verdict.
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
    if workload == "mlp":
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("engine", "mlp"), default="engine")
    parser.add_argument("--sources", default="recordfn,profiler", help="comma list of recordfn, profiler, off")
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
    else:
        step = engine_step(args.requests, args.new_tokens)
        what = f"smoke engine generation, {args.requests} requests x {args.new_tokens} tokens"
    with tempfile.TemporaryDirectory() as run_dir:
        os.environ["HARNESS_TRACE_DIR"] = run_dir
        arms = {"off": make_arm(args.workload, None, 0, step)}
        for rank, source in enumerate(sources):
            arms[source] = make_arm(args.workload, source, rank, step)
        times: dict[str, list[float]] = {name: [] for name in arms}
        for run in arms.values():
            run()  # warm-up
        for _ in range(args.blocks):
            for name, run in arms.items():
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - t0)
    off = statistics.median(times["off"])
    print(f"workload: {what}; {len(times['off'])} steps per arm, 1 thread")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:9s} median {med * 1e3:9.1f} ms   ratio {med / off:6.2f}")


if __name__ == "__main__":
    main()
