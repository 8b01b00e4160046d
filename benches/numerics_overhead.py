"""What the numerics surface costs a policy step: ``engine.train`` with the probe off and at each depth.

    python3 benches/numerics_overhead.py [--workload qwen3_moe_tiny_tp2pp2cp2ep2] [--rounds 5]
        [--depths blocks,modules] [key.path=value ...]

The workload's policy world runs as in ``golden check`` minus Ray: ``torch.multiprocessing``
ranks (``suites.local_world.spawn_world``, gloo) for a CPU spec, or in this process for a
1-rank spec on cuda (``platform.device=cuda``, e.g. ``qwen3_moe_medium_vllm``). One train
batch of a step's size (``prompts_per_step x generations_per_prompt`` rows,
``harness.policy.synthetic``); every round runs every arm once, in an order that rotates
by one per round, after a ``gc.collect()`` (and a barrier):

* ``off``: ``engine.train`` with no probe installed (what a golden without the surface ran);
* ``<depth>``: the same with a ``NumericsProbe`` of that depth installed, the step's
  parameter digests and the step's artifact written, exactly as ``PolicyWorker`` does.

Prints per arm the median over rounds of the slowest rank's step and its ratio to ``off``
(goal at the default depth ``modules``: <= 1.10), the CPU seconds all ranks spent in it
(``time.process_time``, threads included: steadier than wall time on a busy box), the
ratio over the workload's whole run (``grpo.iterations`` steps, the first and the last
digested: the default ``numerics.steps``) and the digests per step. Informational:
no verdict; the load average before and after says how quiet the box was.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout: suites/ holds the spawn helper


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _arm(engine, shard, depth: str, out_dir: str, rank: int) -> tuple[float, int, float]:
    from harness.policy.numerics_probe import NumericsProbe

    probe = None
    if depth != "off":
        probe = NumericsProbe(depth, dict(engine.coords), engine.backend)
        probe.install()
        probe.begin_step()
    try:
        _sync(engine.device)
        t, cpu = time.perf_counter(), time.process_time()
        engine.train(shard)
        if probe is not None:
            probe.end_step(engine.named)
            probe.write(Path(out_dir) / f"rank{rank:05d}.{depth}.json")
        _sync(engine.device)
        return (time.perf_counter() - t, len(probe.entries) if probe is not None else 0,
                time.process_time() - cpu)
    finally:
        if probe is not None:
            probe.uninstall()


def numerics_job(engine, batch, rounds: int, arms: tuple[str, ...], out_dir: str) -> dict:
    import torch.distributed as dist

    from harness.parallel.data import shard_for_dp

    shard = shard_for_dp(batch, engine.spec.policy.dp, engine.coords["dp"])
    engine.train(shard)  # warm-up
    times: dict[str, list[float]] = {a: [] for a in arms}
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    entries: dict[str, int] = {}
    for r in range(rounds):
        order = arms[r % len(arms):] + arms[: r % len(arms)]
        for arm in order:
            gc.collect()
            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.barrier()
            seconds, n, used = _arm(engine, shard, arm, out_dir, engine.rank)
            times[arm].append(seconds)
            cpu[arm].append(used)
            entries[arm] = n
    return {"times": times, "cpu": cpu, "entries": entries}


def _inline(spec, fn, *args) -> list[dict]:
    """A 1-rank world in this process (the cuda path: NCCL, the spec's device)."""
    import torch.distributed as dist

    from harness.parallel.rendezvous import RendezvousServer
    from harness.policy.distributed import init_distributed
    from harness.registry.policy import create_engine
    from harness.spec.typed import as_workload

    held = RendezvousServer()
    init_distributed(0, 1, "127.0.0.1", held.port, spec["platform"]["device"])
    try:
        return [fn(create_engine(as_workload(spec), 0), *args)]
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="qwen3_moe_tiny_tp2pp2cp2ep2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--depths", default="blocks,modules")
    parser.add_argument("overrides", nargs="*", help="spec overrides key.path=value")
    args = parser.parse_args()

    from harness.policy.synthetic import synthetic_batch
    from harness.spec import load_spec
    from harness.spec.typed import as_workload
    from suites.local_world import spawn_world

    spec = load_spec(str(ROOT / "goldens" / args.workload / "workload.yaml"), args.overrides)
    w = as_workload(spec)
    rows = w.grpo.prompts_per_step * w.grpo.generations_per_prompt
    batch = synthetic_batch(spec, rows, seed=0)
    arms = ("off", *(d.strip() for d in args.depths.split(",") if d.strip()))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="numerics-overhead-") as tmp:
        if w.platform.device == "cpu":
            results = spawn_world(spec, numerics_job, batch, args.rounds, arms, tmp, timeout_s=1800.0)
        else:
            if w.policy.world_size != 1:
                parser.error("a cuda spec runs here as a 1-rank world only")
            results = _inline(spec, numerics_job, batch, args.rounds, arms, tmp)
    wall = time.perf_counter() - t0
    med = {a: statistics.median(max(res["times"][a][r] for res in results) for r in range(args.rounds))
           for a in arms}
    print(f"{args.workload} on {w.platform.device}: {len(results)} rank(s), batch {rows} x {w.policy.seq_len}, "
          f"{args.rounds} rounds, {wall:.1f} s in all")
    cpu = {a: statistics.median(sum(res["cpu"][a][r] for res in results) for r in range(args.rounds)) for a in arms}
    steps = max(1, w.grpo.iterations)
    digested = min(steps, 2)   # numerics.steps absent: the first and the last step
    print(f"{'arm':<10}{'median s':>10}{'x off':>8}{'cpu s (all ranks)':>19}{'x off':>8}"
          f"{'x off over the run':>20}{'digests/step (max rank)':>26}")
    for a in arms:
        n = max(res["entries"].get(a, 0) for res in results)
        run = (digested * med[a] + (steps - digested) * med["off"]) / (steps * med["off"])
        print(f"{a:<10}{med[a]:>10.3f}{med[a] / med['off']:>8.3f}{cpu[a]:>19.3f}{cpu[a] / cpu['off']:>8.3f}"
              f"{run:>20.3f}{n:>26}")
    print(f"x off over the run: the workload's {steps} steps with the first and the last digested "
          f"(numerics.steps absent), the others at the off time")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
