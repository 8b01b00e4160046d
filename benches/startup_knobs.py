"""The runner's start-up switches, on and off, side by side in one run.

    python3 benches/startup_knobs.py [--workloads W,W,...] [--rounds N] [--json FILE]

Each *setting* is a set of environment switches of the runner (docs/runner.md):
``GOLDEN_WORKER_EXEC=0`` (workers start through Ray's own setup_worker.py, which
imports ray first), ``GOLDEN_GC_FREEZE=0`` (no ``gc.freeze`` in the zygote, warm
hosts and engine processes) and ``GOLDEN_LEAN_HEAD=0`` (the head node starts Ray's
autoscaler monitor and log monitor). For every round, each setting runs
``benches/golden_phases.py --mode warm`` over the same workloads in a process of its
own (a fresh warm runtime: Ray, zygote and pool start inside it), one setting right
after the other and in a rotated order each round, so a box whose speed drifts
stretches them alike. Prints, per setting, the mean wall seconds and CPU seconds
of the whole process tree (the phase bench's cpuacct cgroup), the policy-start and
steps phases, and each figure's ratio to the default (all switches on), plus
whether every run was at parity with its golden (a switch that moved a surface
would show here). Exits 1 when a run was not at parity.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SETTINGS = {
    "default": {},
    "GOLDEN_WORKER_EXEC=0": {"GOLDEN_WORKER_EXEC": "0"},
    "GOLDEN_GC_FREEZE=0": {"GOLDEN_GC_FREEZE": "0"},
    "GOLDEN_LEAN_HEAD=0": {"GOLDEN_LEAN_HEAD": "0"},
    "both off": {"GOLDEN_WORKER_EXEC": "0", "GOLDEN_GC_FREEZE": "0"},
}
PHASES_SHOWN = ("policy", "steps")
BENCH = Path(__file__).resolve().with_name("golden_phases.py")


def run_setting(env_over: dict[str, str], workloads: str, out: Path) -> dict:
    env = {**os.environ, **env_over}
    result = subprocess.run([sys.executable, str(BENCH), "--mode", "warm", "--workloads", workloads,
                             "--json", str(out)], env=env, capture_output=True, text=True)
    if result.returncode != 0 or not out.is_file():
        raise SystemExit(f"golden_phases.py failed under {env_over or 'the default'}:\n{result.stderr[-3000:]}")
    return json.loads(out.read_text())


def summarize(runs: list[dict]) -> dict:
    n = len(runs)
    rows = [r for run in runs for r in run["rows"]]
    return {
        "wall": sum(r["total"] for r in rows) / n,
        "cpu": sum(r["cpu_total"] for r in rows) / n,
        **{f"cpu_{p}": sum(r["cpu_phases"][p] for r in rows) / n for p in PHASES_SHOWN},
        "parity": all(r["status"] == "parity" for r in rows),
        "statuses": sorted({r["status"] for r in rows}),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="smoke,tp2pp2cp2ep2,dtensor")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = list(SETTINGS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    print(f"load average before: {os.getloadavg()[0]:.2f}; workloads {args.workloads}; {args.rounds} round(s)",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="startup-knobs-") as tmp:
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                run = run_setting(SETTINGS[name], args.workloads, Path(tmp) / f"{rnd}-{len(runs[name])}.json")
                runs[name].append(run)
                total = sum(r["total"] for r in run["rows"])
                cpu = sum(r["cpu_total"] for r in run["rows"])
                print(f"  round {rnd + 1} {name}: {total:.1f} s, {cpu:.1f} CPU s", flush=True)
    summary = {name: summarize(runs[name]) for name in names}
    base = summary["default"]
    head = f"{'setting':<22} {'wall s':>8} {'CPU s':>8} " + " ".join(f"{'CPU ' + p:>11}" for p in PHASES_SHOWN) \
        + f" {'wall/def':>9} {'CPU/def':>8}  parity"
    print(head)
    print("-" * len(head))
    for name in names:
        s = summary[name]
        print(f"{name:<22} {s['wall']:8.1f} {s['cpu']:8.1f} "
              + " ".join(f"{s['cpu_' + p]:11.1f}" for p in PHASES_SHOWN)
              + f" {s['wall'] / base['wall']:9.2f} {s['cpu'] / base['cpu']:8.2f}  "
              + ("yes" if s["parity"] else f"NO ({', '.join(s['statuses'])})"))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=2) + "\n")
    return 0 if all(s["parity"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
