"""What the CPU numerics pins cost: `golden run` of CPU workloads pinned and unpinned, side by side.

Each round runs every workload once per arm, the arms' order alternating between rounds (the
box's speed drifts): ``pinned`` is the default (harness.portable.pins), ``unpinned`` sets
``GOLDEN_CPU_PINS=0`` (the machine's own ATen/MKL code paths, no portable kernels). Prints
each run's wall time less the numerics canary's seconds (a pinned ``golden run`` checks the
canary once per process, a gate session once in all), each arm's median total, the
pinned/unpinned ratio and the canary's median time.

    python benches/pin_cost.py --rounds 2 [--workloads qwen3_moe_tiny_smoke,...]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ("qwen3_moe_tiny_smoke", "qwen3_moe_tiny_tp2pp2cp2ep2", "qwen3_moe_tiny_megatron_tp2pp2ep2",
           "qwen3_moe_tiny_dtensor")
ARMS = {"pinned": {}, "unpinned": {"GOLDEN_CPU_PINS": "0"}}


CANARY = re.compile(r"numerics canary: .*\((\d+\.\d+)s\)")


def run(workload: str, arm: str, scratch: Path) -> tuple[float, float]:
    """(wall seconds, seconds of it the numerics canary took: a pinned run checks it once per
    process, which a gate session pays once, not once per workload)."""
    env = {k: v for k, v in os.environ.items() if k != "GOLDEN_CPU_PINS"}
    env.update(ARMS[arm])
    run_dir = scratch / f"{workload}-{arm}-{time.monotonic_ns()}"
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "harness.cli", "run", workload, "--run-dir", str(run_dir)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"{workload} [{arm}] exit {out.returncode}: {out.stderr[-1500:]}")
    found = CANARY.search(out.stderr + out.stdout)
    return wall, float(found.group(1)) if found else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workloads", default=",".join(DEFAULT))
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    totals: dict[str, list[float]] = {arm: [] for arm in ARMS}
    canary: list[float] = []
    with tempfile.TemporaryDirectory(prefix="pin-cost-") as tmp:
        for r in range(args.rounds):
            order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
            for arm in order:
                timed = [run(w, arm, Path(tmp)) for w in workloads]
                walls = [wall - checked for wall, checked in timed]  # the canary's seconds counted apart
                canary += [checked for _, checked in timed if checked]
                totals[arm].append(sum(walls))
                print(f"round {r + 1} {arm:9s} total {sum(walls):6.1f}s  " +
                      "  ".join(f"{w.removeprefix('qwen3_moe_tiny_')} {s:.1f}" for w, s in zip(workloads, walls)),
                      flush=True)
    med = {arm: statistics.median(v) for arm, v in totals.items()}
    print(f"median total (canary excluded): pinned {med['pinned']:.1f}s, unpinned {med['unpinned']:.1f}s, "
          f"ratio pinned/unpinned {med['pinned'] / med['unpinned']:.3f}")
    if canary:
        print(f"numerics canary: median {statistics.median(canary):.2f}s a check (once per gate session)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
