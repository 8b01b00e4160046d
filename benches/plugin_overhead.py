"""Step time with the built-in trace profilers on vs off (CPU, small torch workload).

    python3 benches/plugin_overhead.py [--steps 30] [--hidden 256] [--layers 4]

Runs the same seeded training steps through ``PolicyProfilerHooks`` once
with no profiler and once with ``TracePolicyProfiler`` (torch.profiler CPU
activity + collective dispatch-mode recorder + fsync per step), interleaved
in blocks to spread machine noise, and prints the median step times and
their ratio. Informational only; no verdict.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from harness.plugins.policy_hooks import PolicyProfilerHooks
from harness.profiler.trace import TracePolicyProfiler


def make_step(hidden: int, layers: int, batch: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(hidden, hidden), torch.nn.GELU())])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(batch, hidden)

    def train(data_, loss_fn=None, eval_mode=False):
        opt.zero_grad(set_to_none=True)
        loss = model(data_).pow(2).mean()
        loss.backward()
        opt.step()
        return float(loss.detach())

    return train, data


def time_steps(hooks: PolicyProfilerHooks, train, data, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        hooks.run_train(train, data)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, data = make_step(args.hidden, args.layers, args.batch)
    with tempfile.TemporaryDirectory() as run_dir:
        os.environ["HARNESS_TRACE_DIR"] = run_dir
        off_hooks = PolicyProfilerHooks(None)
        on_hooks = PolicyProfilerHooks(TracePolicyProfiler(rank=0))
        time_steps(off_hooks, train, data, 3)  # warm-up
        time_steps(on_hooks, train, data, 3)
        off: list[float] = []
        on: list[float] = []
        for _ in range(args.blocks):
            off += time_steps(off_hooks, train, data, args.steps)
            on += time_steps(on_hooks, train, data, args.steps)
        on_hooks.close()
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(run_dir) for f in fs)
    off_ms, on_ms = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    print(f"workload: MLP {args.layers}x{args.hidden}, batch {args.batch}, AdamW; {len(off)} steps per arm, 1 thread")
    print(f"median step  off: {off_ms:.3f} ms   on (TracePolicyProfiler): {on_ms:.3f} ms")
    print(f"ratio on/off: {on_ms / off_ms:.3f}   trace bytes per step: {size / (len(on) + 3):.0f}")


if __name__ == "__main__":
    main()
