"""Does GRPO on the tiny Qwen3-MoE learn? Mean reward per block of iterations.

    python benches/learning_curve.py [--iterations 50] [--lr 0.003] [--task arith]

Runs the 1-rank smoke workload (profilers off, capture on) for many
iterations and prints the mean reward of every block of 10 steps, first vs
last block, and the ratio. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from harness import flows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--task", default="arith")
    ap.add_argument("--block", type=int, default=10)
    args = ap.parse_args()
    overrides = (
        "plugins.policy_profiler=null", "plugins.rollout_profiler=null",
        f"grpo.iterations={args.iterations}", f"policy.optimizer.lr={args.lr}", f"env.task={args.task}",
    )
    with tempfile.TemporaryDirectory() as tmp:
        ex = flows.execute("qwen3_moe_tiny_smoke", overrides=overrides, run_dir=Path(tmp) / "run")
        rewards = [
            json.loads(line)["metrics"]["reward"] for line in (ex.run_dir / "metrics.jsonl").read_text().splitlines()
        ]
    blocks = [rewards[i : i + args.block] for i in range(0, len(rewards), args.block)]
    means = [sum(b) / len(b) for b in blocks]
    for i, m in enumerate(means):
        print(f"steps {i * args.block + 1:>3}-{i * args.block + len(blocks[i]):>3}: mean reward {m:.4f}")
    print(
        f"first block {means[0]:.4f} -> last block {means[-1]:.4f} (x{means[-1] / means[0]:.2f}); wall {ex.wall_s:.0f}s"
    )


if __name__ == "__main__":
    main()
