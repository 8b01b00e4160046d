"""Terminal renderer: aligned plain-text tables; ANSI colour only on a TTY without NO_COLOR."""

from __future__ import annotations

import os
import sys

from harness.parity.findings import Verdict
from harness.parity.render.common import HEADER, finding_row, summary_line
from harness.parity.render.provenance import provenance_lines

_COLORS = {"fail": "\x1b[31m", "stale": "\x1b[33m", "info": "\x1b[36m", "parity": "\x1b[32m"}
_RESET = "\x1b[0m"


def use_color(stream=None) -> bool:
    """Colour iff the stream is a TTY and NO_COLOR is unset (https://no-color.org)."""
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def render_terminal(verdict: Verdict, *, title: str = "golden parity", color: bool | None = None,
                    limit: int = 25, show_info: bool = False, provenance: dict | None = None) -> str:
    """The verdict as a terminal report. Findings of a surface whose findings are
    all informational (not gated: memory, timings) are summarised in one line
    unless ``show_info``; gated findings are always listed (up to ``limit``)."""
    color = use_color() if color is None else color

    def paint(text: str, status: str) -> str:
        return f"{_COLORS[status]}{text}{_RESET}" if color and status in _COLORS else text

    lines = [f"{title}: " + paint(summary_line(verdict), verdict.status), ""]
    surface_rows = [["surface", "gated", "status", "sections", "differing", "findings"]]
    statuses = []
    for name in sorted(verdict.surfaces):
        s = verdict.surfaces[name]
        surface_rows.append([name, "yes" if s.gated else "info", s.status, str(s.sections_compared),
                             str(s.sections_differing), str(len(s.findings))])
        statuses.append(s.status)
    table = _table(surface_rows)
    lines.append(table[0])
    lines.extend(paint(row, status) for row, status in zip(table[1:], statuses))
    for name in sorted(verdict.surfaces):
        findings = verdict.surfaces[name].findings
        if not findings:
            continue
        if not show_info and all(f.status == "info" for f in findings):
            lines += ["", (f"{name}: {len(findings)} informational finding(s), not gated "
                           "(--show-info or --format json lists them)")]
            continue
        lines += ["", f"{name}: {len(findings)} finding(s)"]
        shown = findings[:limit]
        table = _table([HEADER] + [finding_row(f) for f in shown])
        lines.append("  " + table[0])
        lines.extend("  " + paint(row, f.status) for row, f in zip(table[1:], shown))
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
