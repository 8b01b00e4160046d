"""What the CPU numerics pins cost: `golden run` of CPU workloads pinned and unpinned, side by side.

Each round runs every workload once per arm, the arms' order alternating between rounds (the
box's speed drifts): ``pinned`` is the default (harness.portable.pins), ``unpinned`` sets
``GOLDEN_CPU_PINS=0`` (the machine's own ATen/MKL code paths, no portable kernels). Prints
each run's wall time, each arm's median total and the pinned/unpinned ratio.

    python benches/pin_cost.py --rounds 2 [--workloads qwen3_moe_tiny_smoke,...]
"""

from __future__ import annotations

import argparse
import os
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


def run(workload: str, arm: str, scratch: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k != "GOLDEN_CPU_PINS"}
    env.update(ARMS[arm])
    run_dir = scratch / f"{workload}-{arm}-{time.monotonic_ns()}"
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "harness.cli", "run", workload, "--run-dir", str(run_dir), "-q"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"{workload} [{arm}] exit {out.returncode}: {out.stderr[-1500:]}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workloads", default=",".join(DEFAULT))
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    totals: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="pin-cost-") as tmp:
        for r in range(args.rounds):
            order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
            for arm in order:
                walls = [run(w, arm, Path(tmp)) for w in workloads]
                totals[arm].append(sum(walls))
                print(f"round {r + 1} {arm:9s} total {sum(walls):6.1f}s  " +
                      "  ".join(f"{w.removeprefix('qwen3_moe_tiny_')} {s:.1f}" for w, s in zip(workloads, walls)),
                      flush=True)
    med = {arm: statistics.median(v) for arm, v in totals.items()}
    print(f"median total: pinned {med['pinned']:.1f}s, unpinned {med['unpinned']:.1f}s, "
          f"ratio pinned/unpinned {med['pinned'] / med['unpinned']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
