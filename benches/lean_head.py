"""A warm runtime's start and close with and without the lean head node, side by side in one run.

    python3 benches/lean_head.py [--rounds N]

Each round starts a fresh process per setting (``GOLDEN_LEAN_HEAD`` unset, then ``0``; the
order alternates by round so a drifting box stretches both alike) that prestarts a
``WarmRuntime`` as the pytest plugin does (Ray, zygote, one policy and one rollout process,
a data-plane process), waits until the pooled actors answer, and closes it. Prints per
setting the mean seconds to ready and seconds to close, and the lean/full ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SETTINGS = {"lean (default)": {}, "GOLDEN_LEAN_HEAD=0": {"GOLDEN_LEAN_HEAD": "0"}}

CHILD = r"""
import json, time
t0 = time.perf_counter()
from harness.runner.warm import WarmRuntime
import ray
runtime = WarmRuntime()
runtime.prestart()
for kind in ("policy", "rollout"):
    for handle in runtime._idle[kind]:
        ray.get(handle.__ray_ready__.remote())
ready = time.perf_counter() - t0
t1 = time.perf_counter()
runtime.close()
print("RESULT " + json.dumps({"ready": ready, "close": time.perf_counter() - t1}))
"""


def run_one(env_over: dict[str, str]) -> dict:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", **env_over}
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"the runtime failed under {env_over or 'the default'}:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    names = list(SETTINGS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.rounds} round(s)", flush=True)
    for rnd in range(args.rounds):
        for name in (names if rnd % 2 == 0 else names[::-1]):
            r = run_one(SETTINGS[name])
            runs[name].append(r)
            print(f"  round {rnd + 1} {name}: ready {r['ready']:.2f} s, close {r['close']:.2f} s", flush=True)
    mean = {name: {k: sum(r[k] for r in runs[name]) / len(runs[name]) for k in ("ready", "close")}
            for name in names}
    lean, full = mean[names[0]], mean[names[1]]
    print(f"{'setting':<20} {'ready s':>8} {'close s':>8}")
    for name in names:
        print(f"{name:<20} {mean[name]['ready']:8.2f} {mean[name]['close']:8.2f}")
    print(f"lean/full: ready {lean['ready'] / full['ready']:.2f}, close {lean['close'] / full['close']:.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
