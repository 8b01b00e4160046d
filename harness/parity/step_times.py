"""Per-step driver phase times, golden beside run: what a report shows next to its verdict.

The timings surface is informational (``harness.surfaces.registry``): its findings never
decide a verdict, and a finding appears only when a phase leaves its band. A report
still wants the figures themselves, so a slowdown that stays inside the band (or a
speed-up) is visible next to the parity verdict. This module reads them, and only them:

* from the ``driver`` section of each side's timings surface, the keys
  ``stepNNNN/<phase>`` whose phase has no ``/`` of its own (the top-level phases of a
  GRPO step: ``generation``, ``policy_and_reference_logprobs``, ``policy_training``,
  ``refit``, ``total_step_time``; sub-phases such as ``refit/send`` are left out), each
  ``{"wall_s": seconds}``;
* phases and steps are the union of both sides; a cell one side lacks is ``None``.

Nothing here compares or judges: :func:`step_times` never raises on a document it can
read as a timings surface and returns ``None`` when either side has no driver section
(a run without timings, an old golden). Surfaces reach it already validated against
their schema (``harness.surfaces.schemas``), so values are finite numbers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_KEY = re.compile(r"^step(\d+)/([^/]+)$")
TOTAL_PHASE = "total_step_time"


@dataclass(frozen=True)
class StepTimes:
    """``phases`` in report order (``total_step_time`` last), ``steps`` ascending;
    ``golden`` / ``actual``: {(phase, step): seconds}, a cell absent on that side missing."""

    phases: tuple[str, ...]
    steps: tuple[int, ...]
    golden: Mapping[tuple[str, int], float]
    actual: Mapping[tuple[str, int], float]

    def cell(self, phase: str, step: int) -> tuple[float | None, float | None]:
        """(golden, actual) seconds of one phase in one step."""
        return self.golden.get((phase, step)), self.actual.get((phase, step))

    def totals(self, phase: str) -> tuple[float | None, float | None]:
        """Each side's sum over the steps where both sides have the phase (None: no such step)."""
        pairs = [self.cell(phase, s) for s in self.steps]
        pairs = [(g, a) for g, a in pairs if g is not None and a is not None]
        if not pairs:
            return None, None
        return sum(g for g, _ in pairs), sum(a for _, a in pairs)

    def to_dict(self) -> dict:
        """JSON form: ``{"phases": [...], "steps": [{"step": n, "<phase>": {"golden": s, "actual": s}}]}``."""
        rows = []
        for step in self.steps:
            row: dict[str, Any] = {"step": step}
            for phase in self.phases:
                golden, actual = self.cell(phase, step)
                row[phase] = {"golden": golden, "actual": actual}
            rows.append(row)
        return {"source": "timings surface, driver section (informational, not gated)",
                "phases": list(self.phases), "steps": rows}


def _driver_phases(doc: Mapping[str, Any] | None) -> dict[tuple[str, int], float] | None:
    sections = doc.get("sections") if isinstance(doc, Mapping) else None
    driver = sections.get("driver") if isinstance(sections, Mapping) else None
    phases = driver.get("phases") if isinstance(driver, Mapping) else None
    if not isinstance(phases, Mapping):
        return None
    out = {}
    for key, value in phases.items():
        match = _KEY.match(str(key))
        wall = value.get("wall_s") if isinstance(value, Mapping) else None
        if match and isinstance(wall, (int, float)) and not isinstance(wall, bool):
            out[(match.group(2), int(match.group(1)))] = float(wall)
    return out


def step_times(golden_doc: Mapping[str, Any] | None, actual_doc: Mapping[str, Any] | None) -> StepTimes | None:
    """The per-step phase times of both sides' timings surfaces (None: a side has none)."""
    golden, actual = _driver_phases(golden_doc), _driver_phases(actual_doc)
    if not golden or not actual:
        return None
    keys = set(golden) | set(actual)
    names = sorted({phase for phase, _ in keys})
    phases = tuple([p for p in names if p != TOTAL_PHASE] + ([TOTAL_PHASE] if TOTAL_PHASE in names else []))
    steps = tuple(sorted({step for _, step in keys}))
    return StepTimes(phases=phases, steps=steps, golden=golden, actual=actual)


def seconds_text(golden: float | None, actual: float | None) -> str:
    """``"7.81 -> 6.67"``; a side without the cell shows ``-``."""
    def one(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    return f"{one(golden)} -> {one(actual)}"


def ratio_text(golden: float | None, actual: float | None) -> str:
    """``"x0.85"`` (run / golden); empty when a side is missing or the golden took no time."""
    if golden is None or actual is None or golden <= 0:
        return ""
    return f"x{actual / golden:.2f}"


def table_rows(times: StepTimes, *, limit: int = 20) -> list[list[str]]:
    """Header, one row per step (the first ``limit``), then the sums with run/golden ratios.
    Every human renderer lays out these cells its own way."""
    rows = [["step", *times.phases]]
    for step in times.steps[:limit]:
        rows.append([str(step), *(seconds_text(*times.cell(p, step)) for p in times.phases)])
    if len(times.steps) > limit:
        rows.append([f"... {len(times.steps) - limit} more", *([""] * len(times.phases))])
    sums = []
    for phase in times.phases:
        golden, actual = times.totals(phase)
        sums.append(f"{seconds_text(golden, actual)} {ratio_text(golden, actual)}".strip())
    rows.append(["sum", *sums])
    return rows
