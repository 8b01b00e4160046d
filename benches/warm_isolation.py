"""Every CPU golden, warm after other workloads and cold: byte-identical gated surfaces, in both orders.

    python3 benches/warm_isolation.py [--workloads W,W,...] [--cold] [--json FILE]

The all-goldens version of ``suites/golden/test_cold_warm_isolation.py`` (which
keeps a two-workload subset in CI). For each of two orders, the workloads in
``golden list`` order and reversed, one ``harness.runner.warm.WarmRuntime``
(the pytest plugin's, prestarted as the plugin starts it: its first pool processes, their
engine fork server and the zygote's megatron and dtensor flavours started before any workload;
``--no-prestart``: on its first workload) runs every CPU golden one after
the other, so each workload runs in processes that earlier workloads used (the
first of one order is the last of the other) or, for a backend that is not
pooled (``warm.cold_reason``), in fresh processes forked from the runtime's
zygote after other workloads ran. Each run's gated surface files are compared
byte for byte with the stored golden, which is a cold capture (``golden
refresh`` runs cold). ``--cold`` also runs each workload cold (a private Ray
instance, fresh interpreters, as ``golden check`` does) and compares it the same way.

Prints one line per run (workload, order, reused processes, moved surfaces)
and exits 1 when any run's gated surfaces differ from the golden or a run did
not complete; 0 otherwise. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: suites/ holds the recorder
from suites.worker_pids import PidRecorder

GATED = ("topology", "lifecycle", "operators", "collectives", "rollouts", "training")


def cpu_workloads() -> list[str]:
    from harness.spec.load import default_goldens_root, list_workloads

    root = default_goldens_root()
    return [w for w in list_workloads(root) if (root / w / "cpu" / "manifest.json").is_file()]


def moved_surfaces(run_dir: Path, workload: str) -> list[str]:
    from suites.stored_goldens import stored_dir

    golden = stored_dir(workload) / "surfaces"  # cpu or this machine's CPU-numerics variant
    surfaces = run_dir / "surfaces"
    return [s for s in GATED if (surfaces / f"{s}.json").read_bytes() != (golden / f"{s}.json").read_bytes()]


def run(workload: str, run_root: Path, warm, seen: set[int]) -> dict:
    from harness import flows

    rec = PidRecorder()
    t = time.time()
    run_dir = run_root / f"{workload}-{len(os.listdir(run_root))}"
    execution = flows.execute(workload, run_dir=run_dir, say=rec, platform="cpu", warm=warm)
    pids = {p for ps in rec.pids.values() for p in ps if p is not None}
    row = {"workload": workload, "wall_s": round(time.time() - t, 1), "ok": execution.ok,
           "reused_pids": len(pids & seen), "pids": len(pids),
           "moved": moved_surfaces(run_dir, workload) if execution.ok else list(GATED)}
    seen |= pids
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=None, help="comma-separated (default: every workload with a cpu golden)")
    ap.add_argument("--cold", action="store_true", help="also run each workload cold and compare it")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--no-prestart", action="store_true",
                    help="start each runtime on its first workload, not ahead of it as the pytest plugin does")
    args = ap.parse_args(argv)
    workloads = args.workloads.split(",") if args.workloads else cpu_workloads()
    os.environ.setdefault("GOLDEN_PROGRESS", "off")
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores", flush=True)
    from harness.runner.warm import WarmRuntime

    rows = []
    with tempfile.TemporaryDirectory(prefix="warm-isolation-") as tmp:
        run_root = Path(tmp)
        orders = [("forward", workloads), ("reverse", workloads[::-1])]
        for name, order in orders:
            runtime, seen = WarmRuntime(), set()
            if not args.no_prestart:  # as the pytest plugin starts it (harness.pytest_prestart)
                runtime.prestart()
                runtime.start_flavours(["megatron", "dtensor"])
            try:
                for w in order:
                    rows.append({"order": name, **run(w, run_root, runtime, seen)})
                    r = rows[-1]
                    print(f"  {name:<8} {w:<34} {r['wall_s']:6.1f}s reused {r['reused_pids']}/{r['pids']} pids  "
                          f"{'identical' if not r['moved'] else 'MOVED ' + ','.join(r['moved'])}", flush=True)
            finally:
                runtime.close()
        if args.cold:
            for w in workloads:
                rows.append({"order": "cold", **run(w, run_root, None, set())})
                r = rows[-1]
                print(f"  {'cold':<8} {w:<34} {r['wall_s']:6.1f}s  "
                      f"{'identical' if not r['moved'] else 'MOVED ' + ','.join(r['moved'])}", flush=True)
    load = os.getloadavg()
    bad = [r for r in rows if r["moved"] or not r["ok"]]
    print(f"{len(rows)} runs, {len(bad)} with gated surfaces that differ from the cold golden")
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
