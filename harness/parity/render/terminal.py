"""Terminal renderer: the first divergence first, full values wrapped; ANSI colour only on a TTY without NO_COLOR.

Layout: summary line, per-surface table, then the causes in execution order (each
with its location, position, both values and its consequences counted), then the
findings per surface. Values are wrapped, never cut; a long list shows a window
around the element that differs, marked ``>>x<<``.
"""

from __future__ import annotations

import os
import sys
import textwrap

from harness.parity.findings import Finding, Verdict
from harness.parity.render.bounded import bounded_document, bounded_step_times, bounded_verdict
from harness.parity.render.common import (
    STATUS_WORD,
    consequences_text,
    location,
    number_cell,
    position_text,
    rules_applied_lines,
    summary_line,
    value_text,
)
from harness.parity.render.provenance import provenance_lines
from harness.parity.step_times import StepTimes, table_rows

_COLORS = {"fail": "\x1b[31m", "stale": "\x1b[33m", "info": "\x1b[36m", "parity": "\x1b[32m"}
_RESET = "\x1b[0m"
WIDTH = 110


def use_color(stream=None) -> bool:
    """Colour iff the stream is a TTY and NO_COLOR is unset (https://no-color.org)."""
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def _wrap(label: str, text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, width=WIDTH, initial_indent=f"{indent}{label}", subsequent_indent=indent + "    ",
                         break_long_words=True, break_on_hyphens=False) or [indent + label]


def finding_block(f: Finding, indent: str = "    ") -> list[str]:
    """The lines of one finding below its heading: position, both values, errors, lane."""
    lines = []
    pos = position_text(f)
    if pos:
        lines += _wrap("", pos, indent)
    lines += _wrap("golden: ", value_text(f.golden, f.actual), indent)
    lines += _wrap("actual: ", value_text(f.actual, f.golden), indent)
    extra = [f"lane {f.lane}"]
    if f.abs_err is not None:
        extra.append(f"abs err {number_cell(f.abs_err)}")
    if f.rel_err is not None:
        extra.append(f"rel err {number_cell(f.rel_err)}")
    lines.append(indent + ", ".join(extra))
    if f.note:
        lines += _wrap("note: ", f.note, indent)
    return lines


def render_terminal(verdict: Verdict, *, title: str = "golden parity", color: bool | None = None,
                    limit: int = 25, show_info: bool = False, provenance: dict | None = None,
                    step_times: StepTimes | None = None) -> str:
    """The verdict as a terminal report. The surface table, then ``step_times`` (golden
    beside run, informational) when given, then the causes (up to ``limit``), then findings
    per surface; a surface whose findings are all informational (not gated: memory, timings)
    is summarised in one line unless ``show_info``."""
    verdict, provenance = bounded_verdict(verdict), bounded_document(provenance)  # issue 41: bounded output
    step_times = bounded_step_times(step_times)
    color = use_color() if color is None else color

    def paint(text: str, status: str) -> str:
        return f"{_COLORS[status]}{text}{_RESET}" if color and status in _COLORS else text

    lines = [f"{title}: " + paint(summary_line(verdict), verdict.status), ""]
    if verdict.spec is not None:  # the cause of everything below: first (harness.parity.spec_check)
        spec_lines = verdict.spec.lines()
        word = "FAIL" if verdict.spec.gating else "NOTE"
        lines += [paint(f"{word} {spec_lines[0]}", verdict.spec.status), *spec_lines[1:], ""]
    surface_rows = [["surface", "gated", "status", "sections", "differing", "findings"]]
    statuses = []
    for name in sorted(verdict.surfaces):
        s = verdict.surfaces[name]
        surface_rows.append([name, "yes" if s.gated else "info", s.status, str(s.sections_compared),
                             str(s.sections_differing), str(len(s.findings))])
        statuses.append(s.status)
    table = _table(surface_rows)
    if statuses:  # none: a verdict decided before any run (the spec)
        lines.append(table[0])
        lines.extend(paint(row, status) for row, status in zip(table[1:], statuses))
    applied = rules_applied_lines(verdict)
    if applied:
        lines += ["", "tolerance rules that changed the verdict:"] + ["  " + line for line in applied]
    if step_times is not None:
        lines += ["", "step times, seconds (golden -> this run; informational, not gated):"]
        lines += ["  " + row for row in _table(table_rows(step_times))]
    causes = verdict.divergences
    if causes:
        gated = sum(1 + len(d.consequences) for d in causes)
        lines += ["", (f"first divergence: {len(causes)} cause(s) of {gated} gated finding(s), in execution order "
                       "(step, phase, rank)")]
        for n, d in enumerate(causes[:limit], 1):
            f = d.cause
            lines.append(paint(f" {n}. {STATUS_WORD[f.status]} {location(f)}", f.status))
            lines += finding_block(f)
            lines.append(f"    {consequences_text(d)}")
        if len(causes) > limit:
            lines.append(f"  ... and {len(causes) - limit} more cause(s) (--format json lists all)")
    for name in sorted(verdict.surfaces):
        findings = verdict.surfaces[name].findings
        if not findings:
            continue
        whole = [f for f in findings if f.status == "info" and f.section is None and f.note]
        if not show_info and len(whole) == len(findings):   # e.g. an optional surface not in this golden
            lines += ["", *(f"{name}: {f.note}" for f in whole)]
            continue
        if not show_info and all(f.status == "info" for f in findings):
            lines += ["", (f"{name}: {len(findings)} informational finding(s), not gated "
                           "(--show-info or --format json lists them)")]
            continue
        lines += ["", f"{name}: {len(findings)} finding(s)"]
        shown = findings[:limit]
        for f in shown:
            lines.append(paint(f"  {STATUS_WORD[f.status]} {location(f)}", f.status))
            lines += finding_block(f, indent="      ")
        for f in shown:
            if f.status == "stale":
                lines.append(
                    f"  note: {f.section} {f.key}: exact lane fails, inside tolerance "
                    f"(abs {f.tolerance['abs']}, rel {f.tolerance['rel']}: {f.tolerance['reason']}): "
                    "probable stale golden"
                )
                break
        if len(findings) > limit:
            lines.append(f"  ... and {len(findings) - limit} more (--format json lists all)")
    lines += provenance_lines(provenance)
    return "\n".join(lines) + "\n"
