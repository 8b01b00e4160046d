"""Where one policy rank's GRPO step goes: the model's own ops, the harness's recording, gloo.

    python3 benches/step_overhead.py [--workload qwen3_moe_tiny_multiturn] [--rounds 5] [--arms A,B,...] [--json FILE]

The bench starts the workload's policy world in plain ``torch.multiprocessing`` ranks
(``suites.local_world.spawn_world``: gloo, one thread per rank, the engine the spec
selects, no Ray), builds one train batch of a step's size (``prompts_per_step x
generations_per_prompt`` rows, ``harness.policy.synthetic``) and times, on every rank,
the pieces a step of ``golden check`` runs, side by side in one run:

* ``train bare``: ``engine.train`` alone (the ops a golden's operator surface counts);
* ``train traced``: the same call inside ``TracePolicyProfiler`` (``PolicyProfilerHooks``,
  the default sources: the C++ operator counter and the collective recorder, a trace file
  written and fsynced at the phase end), which is what a golden's rank runs;
* ``train ops-off``: the profiler with ``HARNESS_TRACE_OPERATORS=off`` (collectives only);
* ``train counter``: only the C++ operator counter around the call;
* ``train recorder``: only the collective recorder around the call;
* ``logprobs`` / ``ref logprobs``: ``get_logprobs`` and ``get_reference_logprobs`` of the
  batch (not profiled windows in a golden run);
* ``weights gather``: one ``hf_state_dict`` (the full weights on rank 0, collective), what a
  refit collects before it streams (once per engine since ``harness.grpo.refitter.stream_to_each``;
  once per engine TP rank before);
* ``in collectives``: the seconds a bare train step spends inside ``torch.distributed``
  calls (gloo's round trips, and waiting for the peer ranks), measured by a timing wrapper
  around the calls this bench installs in its own ranks only.

Every round runs every arm once, in an order that rotates by one per round, each after a
``gc.collect()`` and a barrier; the table prints each arm's median over rounds (the
slowest rank's), its ratio to ``train bare``, the operator entries per step (from the
counter) and the bare step's seconds per entry. It also prints the load average before
and after: on a shared 2-core box the figures mean something only beside it.
Informational only; no verdict. Nothing of the harness is changed by it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout: suites/ holds the spawn helper

ARMS = ("train bare", "train traced", "train ops-off", "train counter", "train recorder", "logprobs", "ref logprobs",
        "weights gather")


def _timed_collectives(totals: dict[str, float]) -> None:
    """Wrap this rank's ``torch.distributed`` collectives (already settled) with a timer."""
    import functools

    import torch.distributed as dist

    from harness.parallel.settle import WRAPPED

    for name in WRAPPED:
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "__bench_timed__", False):
            continue

        def make(inner):
            @functools.wraps(inner)
            def call(*args, **kwargs):
                if not totals.get("on"):
                    return inner(*args, **kwargs)
                t = time.perf_counter()
                try:
                    return inner(*args, **kwargs)
                finally:
                    totals["seconds"] += time.perf_counter() - t
                    totals["calls"] += 1

            call.__bench_timed__ = True  # type: ignore[attr-defined]
            return call

        setattr(dist, name, make(fn))

    from harness.parallel import settle

    inner_wait = settle.wait_released

    def timed_wait(*args, **kwargs):  # settled() looks the function up at call time
        if not totals.get("on"):
            return inner_wait(*args, **kwargs)
        t = time.perf_counter()
        try:
            return inner_wait(*args, **kwargs)
        finally:
            totals["settle"] += time.perf_counter() - t

    settle.wait_released = timed_wait


def overhead_job(engine, batch, rounds: int, trace_dir: str, selected: tuple[str, ...] = ARMS) -> dict:
    """Runs on every rank: every arm once per round, rotated; returns seconds per arm."""
    import torch.distributed as dist

    from harness.parallel.data import shard_for_dp
    from harness.plugins.policy_hooks import PolicyProfilerHooks
    from harness.profiler import opcount
    from harness.profiler.collectives import CollectiveRecorder
    from harness.profiler.trace import TracePolicyProfiler

    rank = engine.rank
    shard = shard_for_dp(batch, engine.spec.policy.dp, engine.coords["dp"])
    os.environ["HARNESS_TRACE_DIR"] = os.path.join(trace_dir, "full")
    os.environ.pop("HARNESS_TRACE_OPERATORS", None)
    full = PolicyProfilerHooks(TracePolicyProfiler(rank=rank))
    os.environ["HARNESS_TRACE_DIR"] = os.path.join(trace_dir, "off")
    os.environ["HARNESS_TRACE_OPERATORS"] = "off"
    ops_off = PolicyProfilerHooks(TracePolicyProfiler(rank=rank))
    os.environ.pop("HARNESS_TRACE_OPERATORS", None)
    collectives = {"seconds": 0.0, "calls": 0, "settle": 0.0, "on": False}
    _timed_collectives(collectives)
    entries: list[int] = []

    def traced(hooks):
        with hooks.train_step():
            engine.train(shard)

    def counter():
        c = opcount.RecordFunctionCounter()
        c.start()
        try:
            engine.train(shard)
        finally:
            counts, _ = c.stop()
            entries.append(sum(counts.values()))

    def recorder():
        r = CollectiveRecorder()
        r.start()
        try:
            engine.train(shard)
        finally:
            r.stop()

    def bare():
        collectives["on"] = True
        try:
            engine.train(shard)
        finally:
            collectives["on"] = False

    arms = {
        "train bare": bare,
        "train traced": lambda: traced(full),
        "train ops-off": lambda: traced(ops_off),
        "train counter": counter,
        "train recorder": recorder,
        "logprobs": lambda: engine.get_logprobs(shard),
        "ref logprobs": lambda: engine.get_reference_logprobs(shard),
        "weights gather": engine.hf_state_dict,
    }
    arms = {name: arms[name] for name in selected}
    engine.train(shard)  # warm-up (first-call costs are start-up, not step work)
    times: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, list[float]] = {name: [] for name in arms}
    in_collectives: list[float] = []
    in_settle: list[float] = []
    names = list(arms)
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            gc.collect()
            dist.barrier()
            before, settle_before = collectives["seconds"], collectives["settle"]
            t, c = time.perf_counter(), time.process_time()
            arms[name]()
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
            if name == "train bare":
                in_collectives.append(collectives["seconds"] - before)
                in_settle.append(collectives["settle"] - settle_before)
    full.close()
    ops_off.close()
    return {"times": times, "cpu": cpu, "in_collectives": in_collectives, "in_settle": in_settle, "entries": entries,
            "collective_calls": collectives["calls"] // max(1, rounds)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="qwen3_moe_tiny_multiturn")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--arms", default=",".join(ARMS),
                        help="comma list of arms to run ('train bare' always runs: the ratios are to it)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"--arms: unknown {unknown}; expected some of {', '.join(ARMS)}")
    arms = tuple(a for a in ARMS if a in arms or a == "train bare")

    from harness.policy.synthetic import synthetic_batch
    from harness.spec import load_spec
    from harness.spec.typed import as_workload
    from suites.local_world import spawn_world

    spec = load_spec(str(ROOT / "goldens" / args.workload / "workload.yaml"), [])
    g = as_workload(spec).grpo
    rows = g.prompts_per_step * g.generations_per_prompt
    batch = synthetic_batch(spec, rows, seed=0)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="step-overhead-") as tmp:
        results = spawn_world(spec, overhead_job, batch, args.rounds, tmp, arms, timeout_s=1800.0)
    wall = time.perf_counter() - t0
    world = len(results)
    # the step of the world is its slowest rank's: per round, the max over ranks
    med = {name: statistics.median(max(res["times"][name][r] for res in results) for r in range(args.rounds))
           for name in arms}
    cpu = {name: statistics.median(sum(res["cpu"][name][r] for res in results) for r in range(args.rounds))
           for name in arms}
    coll = statistics.median(max(res["in_collectives"][r] for res in results) for r in range(args.rounds))
    settle_s = statistics.median(max(res["in_settle"][r] for res in results) for r in range(args.rounds))
    entries = max((res["entries"][0] for res in results if res["entries"]), default=0)
    base = med["train bare"]
    print(f"{args.workload}: {world} rank(s), batch {rows} x {as_workload(spec).policy.seq_len}, "
          f"{args.rounds} rounds, {wall:.1f} s in all")
    print(f"{'arm':<18}{'median s':>10}{'x bare':>9}{'CPU s':>9}{'x bare':>9}   (CPU: all ranks, all threads)")
    for name in arms:
        print(f"{name:<18}{med[name]:>10.3f}{med[name] / base:>9.2f}"
              f"{cpu[name]:>9.3f}{cpu[name] / cpu['train bare']:>9.2f}")
    print(f"{'in collectives':<18}{coll:>10.3f}{coll / base:>9.2f}   "
          f"({results[0]['collective_calls']} torch.distributed calls per bare step, rank 0)")
    print(f"{'  of it settling':<18}{settle_s:>10.3f}{settle_s / base:>9.2f}   "
          "(harness.parallel.settle: waiting for gloo to drop its tensor references)")
    if entries:
        print(f"operator entries per train step (slowest rank): {entries}; bare step per entry: "
              f"{1e6 * (base - coll) / entries:.2f} us outside collectives")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        figures = {"workload": args.workload, "median_s": med, "cpu_s": cpu, "in_collectives_s": coll,
                   "in_settle_s": settle_s, "entries": entries, "ranks": results}
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
