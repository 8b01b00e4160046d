"""Build the surface documents from a run directory's artifacts.

Inputs are only artifacts: ``run.json`` (topology as planned and run), the
per-rank trace files, ``metrics.jsonl`` and ``rollouts.jsonl``. Each builder
returns one document ``{surface, version, workload, sections}`` in the shape
its schema (``harness/surfaces/schemas``) declares; volatile values (wall
times, pids, tokens of the init window) are left out or dropped later by
``registry.normalise``. Pure: no torch, no ray.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.artifacts import layout
from harness.artifacts.segments import merge_segments
from harness.artifacts.trace import TraceFile, read_trace

GATED = ("topology", "lifecycle", "operators", "collectives", "rollouts", "training")
OPTIONAL = ("numerics",)   # gated where a golden has it; built only when the run recorded it
INFORMATIONAL = ("memory", "timings")


class RunArtifacts:
    """Everything a builder may read, loaded once."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run = json.loads((self.run_dir / layout.RUN_JSON).read_text())
        self.workload: str = self.run["workload"]
        self.topology: dict = self.run["topology"]
        segments: dict[str, dict[int, TraceFile]] = {}
        for role in layout.TRACE_ROLES:
            folder = self.run_dir / layout.ARTIFACTS_DIR / role
            for path in sorted(folder.glob(f"rank*{layout.TRACE_SUFFIX}")):
                rel = path.relative_to(self.run_dir).as_posix()
                r, rank, segment = layout.parse_trace_segment(rel)
                segments.setdefault(layout.section_name(r, rank), {})[segment] = read_trace(path)
        # a resumed run's segments are merged at the checkpoint boundary
        self.traces: dict[str, TraceFile] = {
            section: merge_segments([segs[i] for i in sorted(segs)]) for section, segs in sorted(segments.items())
        }
        self.metrics = _read_jsonl(self.run_dir / layout.METRICS)
        self.rollouts = _read_jsonl(self.run_dir / layout.ROLLOUTS)

    def coords(self, section: str) -> dict[str, int]:
        role, rank_part = section.split("/")
        rank = int(rank_part[len("rank"):])
        ranks = self.topology[role]["ranks"]
        return dict(ranks[rank]["coords"]) if rank < len(ranks) else {}


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _doc(name: str, art: RunArtifacts, sections: dict[str, Any]) -> dict:
    return {"surface": name, "version": 1, "workload": art.workload, "sections": sections}


def build_topology(art: RunArtifacts) -> dict:
    sections = {}
    for role in ("policy", "rollout", "teacher"):
        if role not in art.topology:
            continue  # teacher: distillation workloads only
        t = art.topology[role]
        sections[role] = {
            "world_size": t["world"],
            "layout": dict(t["sizes"]),
            "ranks": [
                {"rank": r["rank"], "coords": r["coords"], "node": r["node"], "device": r["device"]}
                for r in t["ranks"]
            ],
            "groups": t["groups"],
        }
    return _doc("topology", art, sections)


def build_lifecycle(art: RunArtifacts) -> dict:
    sections = {}
    for section, trace in art.traces.items():
        events = []
        for rec in trace.of_type("event"):
            event = {"event": rec["event"], "phase": rec.get("phase")}
            if rec.get("reason") is not None:
                event["reason"] = rec["reason"]
            events.append(event)
        sections[section] = {"coords": art.coords(section), "events": events, "closed": trace.closed}
    return _doc("lifecycle", art, sections)


def _phases(art: RunArtifacts, pick: Callable[[dict], dict]) -> dict[str, dict]:
    sections = {}
    for section, trace in art.traces.items():
        phases = {rec["phase"]: pick(rec) for rec in trace.of_type("phase")}
        sections[section] = {"coords": art.coords(section), "phases": phases}
    return sections


def build_operators(art: RunArtifacts) -> dict:
    return _doc("operators", art, _phases(
        art, lambda r: {"outcome": r["outcome"], "operators": dict(r.get("operators") or {})}))


def build_collectives(art: RunArtifacts) -> dict:
    return _doc("collectives", art, _phases(
        art, lambda r: {"outcome": r["outcome"], "collectives": [list(c) for c in r.get("collectives") or []]}))


def build_memory(art: RunArtifacts) -> dict:
    return _doc("memory", art, _phases(art, lambda r: dict(r.get("memory") or {})))


def build_timings(art: RunArtifacts) -> dict:
    sections = _phases(art, lambda r: {"wall_s": float(r.get("wall_s") or 0.0)})
    for rec in art.metrics:
        sections.setdefault("driver", {"coords": {}, "phases": {}})
        for key, value in (rec.get("timings") or {}).items():
            sections["driver"]["phases"][f"step{rec['step']:04d}/{key}"] = {"wall_s": float(value)}
    return _doc("timings", art, sections)


def build_rollouts(art: RunArtifacts) -> dict:
    sections = {}
    for rec in art.rollouts:
        sections[rec["rollout_id"]] = {k: v for k, v in rec.items() if k != "rollout_id"}
    return _doc("rollouts", art, sections)


def numerics_files(run_dir: Path) -> dict[str, list[Path]]:
    """The run's numerics artifacts by section (``policy/rankNNNNN``), in step order."""
    out: dict[str, list[tuple[int, Path]]] = {}
    folder = run_dir / layout.NUMERICS_DIR / "policy"
    for path in folder.glob("rank*.step*.json"):
        role, rank, step = layout.parse_numerics_path(path.relative_to(run_dir).as_posix())
        out.setdefault(layout.section_name(role, rank), []).append((step, path))
    return {section: [p for _, p in sorted(items)] for section, items in sorted(out.items())}


def build_numerics(art: RunArtifacts) -> dict | None:
    """Per policy rank: every digest the rank recorded (docs/locator.md), merged over its
    step files; ``None`` when the run recorded none (a run from before the surface). A rank
    that records none keeps ``recorded: false`` and its reason."""
    files = numerics_files(art.run_dir)
    if not files:
        return None
    sections = {}
    for section, paths in files.items():
        body: dict[str, Any] = {}
        entries: dict[str, Any] = {}
        for path in paths:
            doc = json.loads(path.read_text())
            entries.update(doc.get("entries") or {})
            body = {k: v for k, v in doc.items() if k != "entries"}
        body["coords"] = art.coords(section) or body.get("coords", {})
        body["entries"] = entries
        sections[section] = body
    return _doc("numerics", art, sections)


def build_training(art: RunArtifacts) -> dict:
    """Per step: every logged metric. Non-finite values (stored as text in
    metrics.jsonl) are kept under ``nonfinite`` so parity reports them."""
    sections = {}
    for rec in art.metrics:
        metrics = rec["metrics"]
        section = {"step": rec["step"],
                   "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}
        nonfinite = {k: v for k, v in metrics.items() if isinstance(v, str)}
        if nonfinite:
            section["nonfinite"] = nonfinite
        sections[f"step{rec['step']:04d}"] = section
    return _doc("training", art, sections)


BUILDERS: dict[str, Callable[[RunArtifacts], dict | None]] = {
    "topology": build_topology,
    "lifecycle": build_lifecycle,
    "operators": build_operators,
    "collectives": build_collectives,
    "rollouts": build_rollouts,
    "training": build_training,
    "numerics": build_numerics,
    "memory": build_memory,
    "timings": build_timings,
}


def build_all(run_dir: str | Path) -> dict[str, dict]:
    """Every surface (gated, optional and informational) of one run, keyed by name; an
    optional surface the run did not record is absent."""
    art = RunArtifacts(run_dir)
    docs = {name: build(art) for name, build in BUILDERS.items()}
    return {name: doc for name, doc in docs.items() if doc is not None}
