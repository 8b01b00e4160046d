"""Where the seconds of a golden check go, phase by phase, for every CPU golden.

    python3 benches/golden_phases.py [--mode cold|warm|both] [--workloads W,W,...] [--json FILE]

For each workload with a ``cpu`` golden (``golden list``) the bench runs what a
check runs (``flows.execute``, then ``compare_with_golden``) with a progress
sink that records when each phase of ``harness.progress`` begins (the same
``phase`` / ``step`` calls the CLI shows) and the workers' own start-up stamps
(``ready()["timings"]``, handed to the sink's ``detail``), and prints a table:

* ``imports``  driver: loading the workload half (torch, ray);
* ``ray``      ``ray.init`` (0 once a warm runtime's instance is up);
* ``dataplane`` the SQLite data-plane actor;
* ``policy``   spawning the policy ranks, split by the slowest rank's stamps into
  ``spawn`` (driver request -> the actor's module starts importing: Ray's
  worker boot, unless Ray had a prestarted worker with the same runtime env),
  ``imports`` (torch and the harness in the rank; for a worker forked from
  the warm runtime's zygote, ``harness.runner.zygote``, only ray and what the
  zygote did not preload), ``pg``
  (``init_process_group`` and settle), ``engine`` (model, optimizer, seeds,
  profiler) and the rest (waiting on the slowest);
* ``rollout``  the rollout actors (internal engine processes, engine warm-up);
* ``refit``    the initial refit; ``steps`` every GRPO step; ``shutdown``;
* ``postflight`` and ``compare`` (gate half).

``--mode cold`` (default) runs every workload as ``golden check`` does, with
a private Ray instance; ``warm`` runs them in order through one
``WarmRuntime``, as ``pytest -m golden`` does; ``both`` runs cold, then warm.
The bench prints the load average before and after: the wall figures mean
something only next to it (a loaded 2-core box stretches every phase). So it
also prints the CPU seconds of every phase, which the load does not stretch:
the bench moves itself into a ``cpuacct`` cgroup of its own (cgroup v1, as
root; every process it starts, Ray's and the workers', inherits it) and reads
its usage at each phase mark; where that is not possible the CPU table says so.
Informational only; no verdict. Stored goldens are only read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("imports", "ray", "dataplane", "policy", "rollout", "refit", "steps", "shutdown", "postflight", "compare")
POLICY_PARTS = ("spawn", "imports", "pg", "engine")


def bucket(text: str) -> str | None:
    """The table column of a phase line (None: a phase the table does not show separately)."""
    t = text.lower()
    for prefix, name in (("loading torch", "imports"), ("starting ray", "ray"), ("reusing ray", "ray"),
                         ("starting the data plane", "dataplane"), ("initial refit", "refit"),
                         ("step ", "steps"), ("shutting down", "shutdown"), ("postflight", "postflight"),
                         ("compare", "compare")):
        if t.startswith(prefix):
            return name
    if t.startswith("spawning") and "policy" in t:
        return "policy"
    if t.startswith("spawning") and "rollout" in t:
        return "rollout"
    return None


CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")


class CpuMeter:
    """CPU seconds of this process and every process it starts from now on: a ``cpuacct``
    cgroup (v1) of its own that this process moves into. ``read()`` is None when that was not
    possible (no cgroup v1 cpuacct, not root)."""

    def __init__(self) -> None:
        self.path: Path | None = CGROUP_ROOT / f"golden-phases-{os.getpid()}"
        try:
            self.path.mkdir()
            (self.path / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            self.path = None

    def read(self) -> float | None:
        if self.path is None:
            return None
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def by_kind(self) -> dict[int, tuple[str, float]]:
        """{pid: (kind, CPU seconds so far)} of the processes in the group now (``--by-process``)."""
        if self.path is None:
            return {}
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[int, tuple[str, float]] = {}
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            out[int(pid)] = (process_kind(cmd), (int(stat[11]) + int(stat[12])) / tick)
        return out

    def close(self) -> None:
        """Move back to the root group; remove this one once its last process is gone."""
        if self.path is None:
            return
        try:
            (CGROUP_ROOT / "cgroup.procs").write_text(str(os.getpid()))
            for _ in range(50):
                try:
                    self.path.rmdir()
                    break
                except OSError:  # a child still exiting
                    time.sleep(0.1)
        except OSError:
            pass


def process_kind(cmdline: list[bytes]) -> str:
    """A coarse name for a process of a golden run, from its command line."""
    first = cmdline[0].decode(errors="replace")
    text = b" ".join(cmdline).decode(errors="replace")
    if first.startswith("ray::"):
        name = first[5:].split(".")[0].split(":")[-1]
        return "ray::" + ("dataplane" if "DataPlane" in name else name)
    for needle, kind in (("zygote_client", "zygote client"), ("harness.runner.zygote", "zygote"),
                         ("raylet", "raylet"), ("gcs_server", "gcs"), ("multiprocessing", "engine procs"),
                         ("golden_phases", "driver"), ("reaper", "reaper")):
        if needle in text:
            return kind
    return first.rsplit("/", 1)[-1][:20] or "?"


_METER: CpuMeter | None = None  # set by main()
_BY_PROCESS = False  # --by-process


def kind_split(marks: list[tuple[float, str]], proc_marks: list[dict[int, tuple[str, float]]],
               end: dict[int, tuple[str, float]]) -> dict[str, dict[str, float]]:
    """{phase column: {process kind: CPU seconds}} between consecutive marks (a process
    that exited before the next mark loses the CPU it used since the last one it was seen at)."""
    out: dict[str, dict[str, float]] = {}
    for (_, text), a, b in zip(marks, proc_marks, [*proc_marks[1:], end]):
        name = bucket(text)
        if name is None:
            continue
        col = out.setdefault(name, {})
        for pid, (kind, cpu) in b.items():
            col[kind] = col.get(kind, 0.0) + cpu - a.get(pid, (kind, 0.0))[1]
    return out


def _cpu() -> float:
    value = _METER.read() if _METER is not None else None
    return float("nan") if value is None else value


class PhaseRecorder:
    """A ``harness.progress`` reporter that records (wall time, CPU, phase) and the workers' ``detail``."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, str]] = []
        self.cpu_marks: list[float] = []
        self.proc_marks: list[dict[int, tuple[str, float]]] = []  # --by-process: at each phase() mark
        self.details: dict[str, list[dict]] = {}
        self.notes: list[str] = []

    def phase(self, text: str) -> None:
        self.marks.append((time.time(), text))
        self.cpu_marks.append(_cpu())
        if _BY_PROCESS and _METER is not None:
            self.proc_marks.append(_METER.by_kind())

    def step(self, index: int, total: int) -> None:
        self.marks.append((time.time(), f"step {index}/{total}"))
        self.cpu_marks.append(_cpu())
        if _BY_PROCESS and _METER is not None:
            self.proc_marks.append(_METER.by_kind())

    def note(self, text: str) -> None:
        self.notes.append(text)

    def __call__(self, text: str) -> None:
        self.note(text)

    def detail(self, what: str, records: list[dict]) -> None:
        self.details[what] = records

    def durations(self, end: float) -> dict[str, float]:
        out = dict.fromkeys(PHASES, 0.0)
        for (t, text), nxt in zip(self.marks, [*self.marks[1:], (end, "")]):
            name = bucket(text)
            if name is not None:
                out[name] += nxt[0] - t
        return out

    def cpu_durations(self, end: float) -> dict[str, float]:
        """CPU seconds per phase (NaN without a meter)."""
        out = dict.fromkeys(PHASES, 0.0)
        for (_, text), c, c_next in zip(self.marks, self.cpu_marks, [*self.cpu_marks[1:], end]):
            name = bucket(text)
            if name is not None:
                out[name] += c_next - c
        return out

    def policy_parts(self) -> dict[str, float]:
        """Slowest rank's spawn / boot+imports / process groups / engine, from its stamps."""
        spawned = next((t for t, text in self.marks if bucket(text) == "policy"), None)
        parts = dict.fromkeys(POLICY_PARTS, 0.0)
        for rec in self.details.get("policy workers", []):
            st = rec.get("timings") or {}
            if spawned is None or not st:
                continue
            reused = st["import_started"] < spawned  # a warm process: imported before this workload
            cand = {
                "spawn": 0.0 if reused else st["import_started"] - spawned,
                "imports": 0.0 if reused else st["imported"] - st["import_started"],
                "pg": st["process_groups"] - st["init_started"],
                "engine": st["profiler"] - st["process_groups"],
            }
            for k, v in cand.items():
                parts[k] = max(parts[k], v)
        return parts


def cpu_workloads() -> list[str]:
    from harness.spec.load import default_goldens_root, list_workloads

    root = default_goldens_root()
    return [w for w in list_workloads(root) if (root / w / "cpu" / "manifest.json").is_file()]


def chosen_workloads(names: str | None) -> list[str]:
    """``--workloads`` as golden names: each one as given or with the ``qwen3_moe_tiny_`` prefix
    (``smoke`` -> ``qwen3_moe_tiny_smoke``); a name with no CPU golden stops the bench, naming it."""
    known = cpu_workloads()
    if not names:
        return known
    out = []
    for name in names.split(","):
        full = name if name in known else f"qwen3_moe_tiny_{name}"
        if full not in known:
            raise SystemExit(f"golden_phases: --workloads: no CPU golden named {name!r} (known: {', '.join(known)})")
        out.append(full)
    return out


def run_one(workload: str, run_root: Path, warm) -> dict:
    from harness import flows

    rec = PhaseRecorder()
    t0, c0 = time.time(), _cpu()
    execution = flows.execute(workload, run_dir=run_root / f"{workload}-{len(os.listdir(run_root))}",
                              say=rec, platform="cpu", warm=warm)
    rec.phase("compare")
    stored = flows.stored_platform(execution.spec, "cpu", flows.default_goldens_root()) if execution.ok else None
    verdict = flows.compare_with_golden(execution, stored) if stored else None  # cpu or this machine's variant
    end, cpu_end = time.time(), _cpu()
    kinds = kind_split(rec.marks, rec.proc_marks, _METER.by_kind()) if _BY_PROCESS and _METER else {}
    return {"workload": workload, "mode": "warm" if warm is not None else "cold", "total": end - t0,
            "cpu_by_kind": kinds,
            "cpu_total": cpu_end - c0, "cpu_phases": rec.cpu_durations(cpu_end),
            "status": verdict.status if verdict is not None else "incomplete",
            "phases": rec.durations(end), "policy_parts": rec.policy_parts(),
            "cold_reason": next((n for n in rec.notes if n.startswith("cold start")), None)}


def print_table(rows: list[dict]) -> None:
    cols = [*PHASES, *POLICY_PARTS]
    head = f"{'workload':<34} {'mode':<5} " + " ".join(f"{c:>9}" for c in cols) + f" {'total':>7}  result"
    print(head)
    print("-" * len(head))
    for r in rows:
        vals = [r["phases"][c] for c in PHASES] + [r["policy_parts"][c] for c in POLICY_PARTS]
        print(f"{r['workload']:<34} {r['mode']:<5} " + " ".join(f"{v:9.1f}" for v in vals)
              + f" {r['total']:7.1f}  {r['status']}" + (f" ({r['cold_reason']})" if r["cold_reason"] else ""))
    for mode in sorted({r["mode"] for r in rows}):
        sel = [r for r in rows if r["mode"] == mode]
        total = sum(r["total"] for r in sel)
        startup = sum(sum(r["phases"][c] for c in ("imports", "ray", "dataplane", "policy", "rollout", "refit",
                                                      "shutdown")) for r in sel)
        steps = sum(r["phases"]["steps"] for r in sel)
        print(f"{mode}: {total:.1f}s in all; start-up + teardown {startup:.1f}s ({100 * startup / total:.0f}%), "
              f"steps {steps:.1f}s ({100 * steps / total:.0f}%)")
    print(f"({' '.join(POLICY_PARTS)}: the slowest policy rank's share of 'policy'; "
          "0 spawn/imports for a warm process)")
    print()
    if any(r["cpu_total"] != r["cpu_total"] for r in rows):  # NaN: no meter
        print("CPU seconds: not measured (no cpuacct cgroup of our own: cgroup v1 and root needed)")
        return
    print("CPU seconds per phase (the whole process tree: driver, Ray, workers, zygote; cpuacct cgroup)")
    head = f"{'workload':<34} {'mode':<5} " + " ".join(f"{c:>9}" for c in PHASES) + f" {'total':>7}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['workload']:<34} {r['mode']:<5} " + " ".join(f"{r['cpu_phases'][c]:9.1f}" for c in PHASES)
              + f" {r['cpu_total']:7.1f}")
    for mode in sorted({r["mode"] for r in rows}):
        print(f"{mode}: {sum(r['cpu_total'] for r in rows if r['mode'] == mode):.1f} CPU s in all")
    for r in rows:
        for phase, kinds in r.get("cpu_by_kind", {}).items():
            top = sorted(kinds.items(), key=lambda kv: -kv[1])[:6]
            print(f"  {r['workload']} {phase}: " + ", ".join(f"{k} {v:.1f}" for k, v in top if v >= 0.05))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("cold", "warm", "both"), default="cold")
    ap.add_argument("--workloads", default=None,
                    help="comma-separated, full or short names (smoke = qwen3_moe_tiny_smoke; "
                         "default: every workload with a cpu golden)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--by-process", action="store_true",
                    help="also split each phase's CPU by process kind (policy ranks, raylet, zygote, ...)")
    args = ap.parse_args(argv)
    global _METER, _BY_PROCESS
    _BY_PROCESS = args.by_process
    _METER = CpuMeter()  # before anything starts: Ray and every worker inherit the cgroup
    workloads = chosen_workloads(args.workloads)
    os.environ.setdefault("GOLDEN_PROGRESS", "off")
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} "
          f"on {os.cpu_count()} cores (a loaded box stretches every phase)", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="golden-phases-") as tmp:
        run_root = Path(tmp)
        for mode in (("cold", "warm") if args.mode == "both" else (args.mode,)):
            runtime = None
            if mode == "warm":
                from harness.runner.warm import WarmRuntime

                runtime = WarmRuntime()
            try:
                for w in workloads:
                    rows.append(run_one(w, run_root, runtime))
                    print(f"  {mode} {w}: {rows[-1]['total']:.1f}s {rows[-1]['status']}", file=sys.stderr, flush=True)
            finally:
                if runtime is not None:
                    runtime.close()
    load_after = os.getloadavg()
    _METER.close()
    print_table(rows)
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"load_before": load_before, "load_after": load_after, "rows": rows},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
