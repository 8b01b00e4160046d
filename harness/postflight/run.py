"""Postflight: a run directory -> ``manifest.json`` + ``surfaces/*.json``.

Checks completeness (the run finished; every expected artifact exists; every
trace is untorn, uncorrupted and closed; every begun step or attempt was
closed by exactly one finish or abort; one metrics record per iteration) and
records each check with its outcome. Surfaces are written normalised, in
canonical form. The manifest is validated against schema v2 before it is
written; an incomplete run still gets a manifest, with status ``incomplete``
or ``failed`` and the failing checks naming what is missing.

Pure: no torch, no ray.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from harness.artifacts import layout
from harness.artifacts.trace import TraceFile
from harness.manifest.build import artifact_entry, new_manifest, surface_entry
from harness.manifest.validate import ManifestInvalid, validate_manifest
from harness.postflight.placement import placement_check
from harness.spec.typed import as_workload
from harness.surfaces.build import GATED, INFORMATIONAL, OPTIONAL, RunArtifacts, build_all
from harness.surfaces.canonical import surface_file_bytes
from harness.surfaces.registry import normalise

# begin event -> the events that close it
_CLOSERS = {
    "begin_train_step": ("finish_train_step", "abort_train_step"),
    "begin_rollout": ("finish_rollout", "abort_rollout"),
    "begin_engine_initialization": ("end_engine_initialization",),
}


@dataclass
class PostflightResult:
    run_dir: Path
    status: str                     # complete | incomplete | failed
    checks: list[dict]
    surfaces: dict[str, dict]       # normalised documents, by name

    @property
    def failed_checks(self) -> list[dict]:
        return [c for c in self.checks if c["outcome"] == "fail"]


def _check(name: str, ok: bool, detail: str = "") -> dict:
    return {"name": name, "outcome": "pass" if ok else "fail", "detail": detail}


def lifecycle_problems(section: str, trace: TraceFile) -> list[str]:
    """Unclosed or doubly closed steps/attempts in one trace, in words."""
    problems, open_begin = [], None
    for rec in trace.of_type("event"):
        ev = rec["event"]
        if ev in _CLOSERS:
            if open_begin is not None:
                problems.append(f"{section}: {ev} while {open_begin[0]} ({open_begin[1]}) still open")
            open_begin = (ev, rec.get("phase"))
        elif any(ev in closers for closers in _CLOSERS.values()):
            if open_begin is None or ev not in _CLOSERS[open_begin[0]]:
                problems.append(f"{section}: {ev} ({rec.get('phase')}) without a matching begin")
            open_begin = None
    if open_begin is not None:
        problems.append(f"{section}: {open_begin[0]} ({open_begin[1]}) never finished or aborted")
    return problems


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_ABS_PATH = re.compile(r"(?<![\w.~-])/(?:[\w.@+%=~-]+/)*[\w.@+%=~-]+")


def clean_detail(text: str, run_dir: Path | None = None) -> str:
    """A check's detail fit for the manifest: no ANSI colour codes or control characters, and
    no machine paths (a path inside the run directory becomes relative to it, any other
    absolute path keeps only its last component: ``…/worker-3.err``)."""
    text = _ANSI.sub("", text)
    text = "".join(ch if ch.isprintable() or ch in "\n\t" else " " for ch in text)
    if run_dir is not None:
        root = str(Path(run_dir).resolve())
        for prefix in {root, str(run_dir)}:
            text = text.replace(prefix + "/", "").replace(prefix, ".")
    return _ABS_PATH.sub(lambda m: "…/" + m.group(0).rsplit("/", 1)[-1], text)


def completeness_checks(art: RunArtifacts) -> list[dict]:
    run = art.run
    checks = [_check("run_completed", run["status"] == "completed",
                     clean_detail(run.get("error") or f"run status {run['status']}", art.run_dir))]
    missing = [p for p in run["expected_artifacts"] if not (art.run_dir / p).is_file()]
    checks.append(_check("artifacts_present", not missing,
                         "missing: " + ", ".join(missing) if missing else
                         f"{len(run['expected_artifacts'])} expected artifacts present"))
    damaged = [p for t in art.traces.values() for p in t.problems]
    unclosed = [s for s, t in art.traces.items() if not t.closed]
    checks.append(_check("traces_intact", not damaged, "; ".join(damaged[:10])))
    checks.append(_check("traces_closed", not unclosed,
                         "not closed: " + ", ".join(unclosed) if unclosed else ""))
    lifecycle = [p for s, t in art.traces.items() for p in lifecycle_problems(s, t)]
    checks.append(_check("lifecycle_balanced", not lifecycle, "; ".join(lifecycle[:10])))
    iters = run["spec"]["grpo"]["iterations"]
    steps = [m["step"] for m in art.metrics]
    checks.append(_check("metrics_complete", steps == list(range(1, iters + 1)),
                         f"steps logged {steps}, expected 1..{iters}"))
    placed = placement_check(art.run_dir, run)
    if placed is not None:
        checks.append(placed)
    return checks


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _rank_map(topology: dict) -> list[dict]:
    return [
        {"role": role, "rank": r["rank"], "node": r["node"], "device": r["device"], "coords": r["coords"]}
        for role in ("policy", "rollout", "teacher")
        for r in (topology[role]["ranks"] if role in topology else ())
    ]


def postflight(run_dir: str | Path) -> PostflightResult:
    """Write manifest.json and surfaces/ for ``run_dir``; return the outcome."""
    run_dir = Path(run_dir)
    art = RunArtifacts(run_dir)
    checks = completeness_checks(art)
    surfaces = {name: normalise(doc) for name, doc in build_all(run_dir).items()}
    for name, doc in surfaces.items():
        _atomic_write(run_dir / layout.SURFACES_DIR / f"{name}.json", surface_file_bytes(doc))
    run = art.run
    if run["status"] != "completed":
        status = "failed"
    else:
        status = "complete" if all(c["outcome"] == "pass" for c in checks) else "incomplete"
    artifacts = []
    for rel in sorted({*run["expected_artifacts"], *(t_path(s) for s in art.traces)}):
        if (run_dir / rel).is_file():
            role, rank = _role_rank(rel)
            artifacts.append(artifact_entry(run_dir, rel, role=role, rank=rank))
    env = dict(run["environment"])
    env["world_size"] = run["topology"]["policy"]["world"] + (
        0 if run["topology"]["placement"] == "colocated" else run["topology"]["rollout"]["world"])
    spec = as_workload(run["spec"])  # the canonical spec dict the run stored
    manifest = new_manifest(
        run_id=run["run_id"],
        workload=run["workload"],
        spec_digest=run["spec_digest"],
        harness_version=env.pop("harness_version", "unknown"),
        git_commit=run.get("git_commit"),
        environment={k: env[k] for k in ("python", "torch", "ray", "backends", "platform", "device", "world_size",
                                          "cpu_numerics", "cuda_numerics")
                     if k in env and (k not in ("cpu_numerics", "cuda_numerics") or env[k])},
        topology={"policy": run["topology"]["policy"], "rollout": run["topology"]["rollout"],
                  "rank_map": _rank_map(run["topology"])},
        plugins={"policy_profiler": spec.plugins.policy_profiler,
                 "rollout_profiler": spec.plugins.rollout_profiler, "versions": {}},
        iterations=spec.grpo.iterations,
        status=status,
        artifacts=artifacts,
        surfaces=[surface_entry(run_dir, n) for n in (*GATED, *OPTIONAL, *INFORMATIONAL) if n in surfaces],
        checks=checks,
    )
    errors = validate_manifest(manifest, base_dir=run_dir)
    if errors:
        raise ManifestInvalid(run_dir / layout.MANIFEST, errors)
    _atomic_write(run_dir / layout.MANIFEST, surface_file_bytes(manifest))
    _merge_footprint(run_dir)
    return PostflightResult(run_dir, status, checks, surfaces)


def _merge_footprint(run_dir: Path) -> None:
    """``footprint.json`` from the processes' records (``harness.footprint.merge``). A run whose
    records cannot be merged gets none, so its golden stores none and is always selected."""
    from harness.footprint.merge import write_footprint

    try:
        write_footprint(run_dir)
    except (OSError, ValueError):
        (run_dir / "footprint.json").unlink(missing_ok=True)


def t_path(section: str) -> str:
    role, rank = section.split("/")
    return layout.trace_path(role, int(rank[len("rank"):]))


def _role_rank(rel: str) -> tuple[str, int | None]:
    try:
        return layout.parse_trace_path(rel)
    except ValueError:
        return ("driver", None)
