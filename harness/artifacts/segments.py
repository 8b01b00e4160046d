"""Merging the trace segments of a resumed run into one logical trace.

A run stopped after checkpoint step k and resumed writes, per rank, a new
segment whose header carries ``resume_step`` = k. The merged trace is:
segment 0's records of steps <= k, then the next segment's records minus its
engine re-initialisation window (a resume restarts the engines; the window
stays in the segment file but is not part of the run's logical lifecycle),
and so on; the last segment decides whether the trace closed cleanly. Damage
after the cut of a superseded segment (the torn record of the killed process)
is expected and dropped; damage anywhere else is kept. Pure: no torch, no ray.
"""

from __future__ import annotations

import re
from dataclasses import replace

from harness.artifacts.trace import TraceFile

_STEP = re.compile(r"(?:^train/step|^teacher/step|^rollout/step)(\d+)")


def record_step(record: dict) -> int | None:
    """The GRPO step a record belongs to (0 for engine init); None for no phase."""
    phase = record.get("phase")
    if phase is None:
        return None
    if phase == "engine_init":
        return 0
    match = _STEP.match(phase)
    return int(match.group(1)) if match else None


def merge_segments(segments: list[TraceFile]) -> TraceFile:
    """One logical trace from segments in order (a single segment is returned as is)."""
    if len(segments) == 1:
        return segments[0]
    records: list[dict] = []
    problems: list[str] = []
    for index, seg in enumerate(segments):
        nxt = segments[index + 1] if index + 1 < len(segments) else None
        cut = None if nxt is None or nxt.header is None else nxt.header.get("resume_step")
        body = seg.records
        if index > 0:
            body = [r for r in body if record_step(r) != 0]
        if cut is not None:
            body = [r for r in body if (step := record_step(r)) is not None and step <= int(cut)]
            problems += [p for p in seg.problems if "torn record" not in p]
        else:
            problems += seg.problems
        records += body
    last = segments[-1]
    return replace(segments[0], records=records, torn=last.torn, problems=problems)
