"""Postflight check ``placement_as_planned``: every rank ran where the plan put it.

Reads ``placement.json`` (written by ``harness.runner.placement`` for runs whose
actors were placed from the plan: every cold run, local or on a cluster) and the
planned topology in ``run.json``. A rank whose actual node index (its Ray node
mapped back through the run's planned-node -> Ray-node table) or device (the
bundle it held) differs from the plan fails the check, naming role, rank,
planned and actual node; the run is then ``incomplete`` (no verdict, exit 3).
A run that lists ``placement.json`` among its expected artifacts and has none
fails ``artifacts_present`` as well. Runs without it (warm pytest runs, whose
pooled processes are not placed) skip the check.

Pure: no torch, no ray.
"""

from __future__ import annotations

from pathlib import Path

from harness.docio import read_json
from harness.surfaces.canonical import StrictJSONError

PLACEMENT_FILE = "placement.json"
CHECK = "placement_as_planned"


def _check(ok: bool, detail: str) -> dict:
    return {"name": CHECK, "outcome": "pass" if ok else "fail", "detail": detail}


def placement_check(run_dir: Path, run: dict) -> dict | None:
    """The check record, or None when the run has no placement to check."""
    path = Path(run_dir) / PLACEMENT_FILE
    expected = PLACEMENT_FILE in run.get("expected_artifacts", [])
    if not path.is_file():
        return _check(False, f"{PLACEMENT_FILE} missing") if expected else None
    try:
        doc = read_json(path, what=PLACEMENT_FILE)
    except (StrictJSONError, OSError) as exc:
        return _check(False, f"{PLACEMENT_FILE} unreadable: {exc}")
    problems = placement_problems(run["topology"], doc)
    ranks = len(doc.get("ranks", [])) if isinstance(doc, dict) else 0
    return _check(not problems, "; ".join(problems[:10]) + (f" (+{len(problems) - 10} more)" if len(problems) > 10
                                                            else "") if problems else
                  f"{ranks} ranks on their planned node and device")


def placement_problems(topology: dict, doc: object) -> list[str]:
    """Each rank whose recorded placement differs from ``topology``, in words."""
    if not isinstance(doc, dict) or not isinstance(doc.get("ranks"), list):
        return [f"{PLACEMENT_FILE}: no 'ranks' list"]
    seen: dict[tuple[str, int], dict] = {}
    for rec in doc["ranks"]:
        try:
            seen[(rec["role"], int(rec["rank"]))] = rec
        except (KeyError, TypeError, ValueError):
            return [f"{PLACEMENT_FILE}: a rank record without role/rank: {str(rec)[:80]}"]
    problems = []
    for role in ("policy", "rollout", "teacher"):
        if role == "teacher" and not topology.get("teacher"):
            continue  # a distillation workload's teacher ranks only
        for info in topology[role]["ranks"]:
            rec = seen.get((role, info["rank"]))
            if rec is None:
                problems.append(f"{role} rank {info['rank']}: no placement recorded")
                continue
            actual = rec.get("actual") or {}
            node, device = actual.get("node"), actual.get("device")
            if node != info["node"] or (device is not None and device != info["device"]):
                got = "a Ray node outside the plan" if node is None else f"node {node}"
                problems.append(f"{role} rank {info['rank']}: planned node {info['node']} device {info['device']}, "
                                f"actual {got} device {device}")
            elif device is None:
                problems.append(f"{role} rank {info['rank']}: no bundle recorded (not placed from the plan)")
    return problems
