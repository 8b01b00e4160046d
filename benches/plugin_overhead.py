"""Step time with the built-in trace profilers on vs off, per operator source.

    python3 benches/plugin_overhead.py [--workload engine|mlp|model] [--device cpu|cuda] [--medium]
                                       [--sources recordfn,profiler,off] [--components]
                                       [--rounds 15] [--steps 1] [--json FILE]

Workloads:

* ``engine`` (default): one "step" is a rollout window around the native
  generation engine of the smoke golden (tiny Qwen3-MoE, 16 requests x 16 new
  tokens: hundreds of thousands of tiny ops), observed by ``TraceRolloutProfiler``.
  This is the shape that made the trace profilers ~80x slower with
  ``torch.profiler`` + ``key_averages()``.
* ``mlp``: seeded training steps of an MLP (``--hidden``, ``--layers``, AdamW)
  through ``PolicyProfilerHooks`` and ``TracePolicyProfiler``.
* ``model``: forward + backward + AdamW of the reference Qwen3-MoE (tiny, or
  ``--medium`` on a GPU) through the same hooks.

Each source in ``--sources`` gets its own profiler (``HARNESS_TRACE_OPERATORS``
is read when a profiler is built; collectives use the default method).

Method: every round runs each arm ``--steps`` times, in an order that rotates
by one arm per round, with ``gc.collect()`` before each timed step. An arm's
*paired ratio* is the median over rounds of its step time over the no-plugin
arm's in the same round, with a 95% bootstrap interval; pairing cancels the
drift that moves both arms alike. ``no-plugin-b`` (drop with ``--no-control``)
is a second arm with no profiler: its ratio and interval show the noise floor
of the run, and a difference smaller than that is not a finding. For the arms
with an operator inventory the bench also prints the RecordFunction entries
per step and a *predicted* ratio, 1 + entries x the per-entry cost measured on
this host's CPU by a tight loop: what RecordFunction alone should cost.
Informational only; no verdict.

``--components`` adds arms that each wrap the step in ONE piece of what a
trace profiler does per phase, to find where an overhead comes from:
``c:stash`` (an object in torch's thread-local stash, as the collective
recorder keeps its state), ``c:recorder`` (the collective recorder),
``c:memory`` (peak-memory reset + read), ``c:probe-off`` (a whole
``PhaseProbe`` with operators off, no file), ``c:fsync`` (one trace line
written and fsynced, as every phase end does), ``c:counter`` (only the C++
operator counter).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.plugins.policy_hooks import PolicyProfilerHooks
from harness.plugins.rollout_hooks import RolloutProfilerHooks
from harness.profiler.trace import TracePolicyProfiler, TraceRolloutProfiler


@dataclass
class Arm:
    run: Callable[[], None]
    profiler: object | None = None  # the trace profiler observing the arm, if any


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


# A medium Qwen3-MoE for GPUs ("tokenizer-free", 8 layers).
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
    from harness.rollout.engine_worker import initial_weights
    from harness.rollout.native.engine import Engine
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


def make_arm(workload: str, source: str | None, rank: int, step: Callable[[], object], schedule: str = "") -> Arm:
    """One observed step (``source=None``: no profiler) and the profiler observing it.

    ``schedule`` is the profiler's ``HARNESS_TRACE_OPERATOR_STEPS`` (every bench
    step is one phase, numbered from 1).
    """
    if source is not None:
        os.environ["HARNESS_TRACE_OPERATORS"] = source
    os.environ["HARNESS_TRACE_OPERATOR_STEPS"] = schedule
    if workload in ("mlp", "model"):
        profiler = None if source is None else TracePolicyProfiler(rank=rank)
        hooks = PolicyProfilerHooks(profiler)
        return Arm(lambda: hooks.run_train(step) and None, profiler)
    rprofiler = None if source is None else TraceRolloutProfiler(rank=rank)
    rhooks = RolloutProfilerHooks(rprofiler)
    with rhooks.engine_init():
        pass  # the engine is shared by all arms and built before them
    counter = iter(range(1, 1 << 30))

    def run() -> None:
        with rhooks.rollout(f"step{next(counter)}/attempt1"):
            step()

    return Arm(run, rprofiler)


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

    def counter() -> None:
        from harness.profiler.opcount import RecordFunctionCounter

        rf = RecordFunctionCounter()
        rf.start()
        try:
            step()
        finally:
            rf.stop()

    arms = {"c:stash": stash, "c:recorder": recorder, "c:memory": memory, "c:probe-off": probe_off, "c:fsync": fsync,
            "c:counter": counter}
    empty = empty_callback(run_dir)
    if empty is not None:
        def rf_empty() -> None:
            slot = empty.harness_opcount_start()
            try:
                step()
            finally:
                empty.harness_opcount_stop(slot, 1)

        arms["c:rf-empty"] = rf_empty
    return arms


def empty_callback(build_dir: str):
    """The operator counter built with a callback that does nothing (None: cannot build).

    RecordFunction then costs what torch itself spends per op once any callback
    is registered; the ``c:rf-empty`` arm measures that floor.
    """
    import ctypes
    import subprocess
    from pathlib import Path

    from harness.profiler import opcount

    body = "  if (!s.counting) return nullptr;\n"
    cxx = opcount._compiler()
    if body not in opcount.SOURCE or cxx is None:
        return None
    src, out = Path(build_dir) / "rf_empty.cpp", Path(build_dir) / "rf_empty.so"
    src.write_text(opcount.SOURCE.replace(body, "  (void)fn;\n  return nullptr;\n"))
    if subprocess.run(opcount._compile_command(cxx, src, out), check=False, capture_output=True).returncode != 0:
        return None
    lib = ctypes.CDLL(str(out))
    lib.harness_opcount_stop.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.harness_opcount_stop.restype = ctypes.c_int64
    return lib


def recordfunction_cost_ns(iterations: int = 20000, repeats: int = 7) -> tuple[float, float]:
    """``(ns per RecordFunction entry with the counter on, entries per tiny op)`` on this host's CPU.

    A tight loop of a one-element in-place add, counter off vs on, best of
    ``repeats`` (the least disturbed run of each). This is the per-entry cost a
    launch-bound step pays on its critical path.
    """
    from harness.profiler.opcount import RecordFunctionCounter

    x = torch.zeros(1)

    def loop() -> float:
        t0 = time.perf_counter()
        for _ in range(iterations):
            x.add_(1)
        return time.perf_counter() - t0

    off, on, entries = [], [], 0
    for _ in range(repeats):
        off.append(loop())
        rf = RecordFunctionCounter()
        rf.start()
        on.append(loop())
        counts, _ = rf.stop()
        entries = sum(counts.values())
    per_op = entries / iterations
    return (min(on) - min(off)) / iterations / per_op * 1e9, per_op


def paired_ratio(times: dict[str, list[list[float]]], arm: str, base: str, resamples: int = 2000
                 ) -> tuple[float, float, float]:
    """Median over rounds of (arm's step / base's step in the same round), with a 95% bootstrap interval.

    Pairing by round cancels drift (clocks, other tenants) that moves both arms
    alike; the interval says how far the median could move with other rounds.
    """
    ratios = [statistics.fmean(a) / statistics.fmean(b) for a, b in zip(times[arm], times[base])]
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return statistics.median(ratios), meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]


def last_inventory(profiler: object | None) -> dict[str, int] | None:
    """The operator inventory of the profiler's last phase that has one (None: none has)."""
    path = getattr(profiler, "path", None)
    if path is None:
        return None
    ops = None
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            record = json.loads(line)
            if record.get("type") == "phase" and record.get("operators") is not None:
                ops = record["operators"]
    return ops


def run_rounds(arms: dict[str, Arm], rounds: int, steps: int) -> dict[str, list[list[float]]]:
    """Every round runs each arm ``steps`` times; the arm order rotates by one each round.

    ``gc.collect()`` runs before each timed step, so garbage one arm leaves
    is not collected on another arm's clock.
    """
    names = list(arms)
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            per_round = []
            for _ in range(steps):
                gc.collect()
                t0 = time.perf_counter()
                arms[name].run()
                per_round.append(time.perf_counter() - t0)
            times[name].append(per_round)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("engine", "mlp", "model"), default="engine")
    parser.add_argument("--device", default="cpu", help="cpu | cuda (model workload)")
    parser.add_argument("--medium", action="store_true", help="model workload: the medium config (GPU)")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--sources", default="recordfn,profiler", help="comma list of recordfn, profiler, off")
    parser.add_argument("--components", nargs="?", const="all", default="",
                        help="add one arm per piece of the per-phase work (all, or a comma list such as "
                             "c:counter,c:rf-empty)")
    parser.add_argument("--schedule", default="",
                        help="add a recordfn arm with this HARNESS_TRACE_OPERATOR_STEPS (e.g. every:10)")
    parser.add_argument("--no-control", action="store_true", help="drop the second no-plugin arm (A/A control)")
    parser.add_argument("--rounds", type=int, default=15, help="rounds; each runs every arm --steps times")
    parser.add_argument("--steps", type=int, default=1, help="steps per arm per round")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--json", help="also write the raw step times and the summary to this file")
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
        if not args.no_control:
            arms["no-plugin-b"] = make_arm(args.workload, None, 0, step)
        for rank, source in enumerate(sources):
            arms[f"ops={source}"] = make_arm(args.workload, source, rank, step)
        if args.schedule:
            arms[f"ops@{args.schedule}"] = make_arm(args.workload, "recordfn", len(sources), step, args.schedule)
        if args.components:
            wanted = None if args.components == "all" else set(args.components.split(","))
            arms.update({name: Arm(run) for name, run in component_arms(step, run_dir).items()
                         if wanted is None or name in wanted})
        for arm in arms.values():
            arm.run()  # warm-up
        times = run_rounds(arms, args.rounds, args.steps)
        inventories = {name: last_inventory(arm.profiler) for name, arm in arms.items()}
        entries = {name: None if inv is None else sum(inv.values()) for name, inv in inventories.items()}
    from harness.profiler.phase import resolve_probe_config

    probe = resolve_probe_config()
    base = statistics.median(t for ts in times["no-plugin"] for t in ts)
    cost_ns, per_op = recordfunction_cost_ns()
    print(f"workload: {what}; {args.rounds} rounds x {args.steps} step(s) per arm, torch {torch.__version__}, "
          f"collectives method {probe.collectives}")
    print(f"RecordFunction entry with the counter on: {cost_ns:.0f} ns on this host's CPU "
          f"(tight loop, {per_op:.0f} entries per op)")
    base_mean = statistics.fmean(t for ts in times["no-plugin"] for t in ts)
    print(f"  {'arm':16s} {'median step':>12s} {'paired ratio':>13s} {'95% interval':>16s} {'mean ratio':>11s} "
          f"{'entries/step':>13s} {'predicted':>10s}")
    summary = {}
    for name, ts in times.items():
        med = statistics.median(t for r in ts for t in r)
        mean_ratio = statistics.fmean(t for r in ts for t in r) / base_mean
        ratio, lo, hi = paired_ratio(times, name, "no-plugin")
        n = entries[name]
        predicted = "" if n is None else f"{1 + n * cost_ns * 1e-9 / base:10.3f}"
        print(f"  {name:16s} {med * 1e3:9.1f} ms {ratio:13.3f}   [{lo:6.3f}, {hi:6.3f}] {mean_ratio:11.3f} "
              f"{'' if n is None else n:>13} {predicted:>10s}")
        summary[name] = {"median_s": med, "ratio": ratio, "ci95": [lo, hi], "mean_ratio": mean_ratio, "entries": n}
    print("paired ratio: median over rounds of the arm's step / no-plugin's step in the same round; "
          "mean ratio: mean step / no-plugin's mean step (the figure for a scheduled arm, whose steps differ); "
          "predicted: 1 + entries x per-entry cost / no-plugin step (RecordFunction's share alone)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"workload": what, "torch": torch.__version__, "record_function_ns": cost_ns,
                       "summary": summary, "times": times, "inventories": inventories}, fh, indent=1)


if __name__ == "__main__":
    main()
