"""Markdown renderer for a CI job summary (GitHub ``$GITHUB_STEP_SUMMARY`` and alike).

The causes come first, in execution order, each with its consequences counted; then
one collapsible table per surface. Values are full (the page wraps them); a long list
shows a window around the element that differs, in bold.
"""

from __future__ import annotations

from harness.parity.findings import Verdict
from harness.parity.render.bounded import bounded_document, bounded_step_times, bounded_verdict
from harness.parity.render.common import (
    HEADER,
    STATUS_WORD,
    consequences_text,
    finding_row,
    location,
    position_text,
    rules_applied_lines,
    summary_line,
    value_text,
)
from harness.parity.render.provenance import provenance_markdown
from harness.parity.step_times import StepTimes, table_rows

_MARK = ("**", "**")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or " "


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _code(text: str) -> str:
    return "`` " + text.replace("`", "'") + " ``"


def render_markdown(verdict: Verdict, *, title: str = "golden parity", limit: int = 50,
                    provenance: dict | None = None, step_times: StepTimes | None = None) -> str:
    """The verdict as Markdown; ``step_times`` (golden beside run, informational) adds a
    collapsed table below the surface table."""
    verdict, provenance = bounded_verdict(verdict), bounded_document(provenance)  # issue 41: bounded output
    step_times = bounded_step_times(step_times)
    lines = [f"### {title}", "", f"**{summary_line(verdict)}**", ""]
    if verdict.spec is not None:  # the first finding (harness.parity.spec_check)
        lines += [f"**{'FAIL' if verdict.spec.gating else 'NOTE'}** {_code(verdict.spec.headline)}", ""]
        lines += [f"- {_code(change)}" for change in verdict.spec.changes] + ([""] if verdict.spec.changes else [])
    lines += [
              _row(["surface", "gated", "status", "sections", "differing", "findings"]),
              _row(["---"] * 6)]
    for name in sorted(verdict.surfaces):
        s = verdict.surfaces[name]
        lines.append(_row([name, "yes" if s.gated else "info", f"**{s.status}**" if s.status != "parity" else s.status,
                           str(s.sections_compared), str(s.sections_differing), str(len(s.findings))]))
    applied = rules_applied_lines(verdict)
    if applied:
        lines += ["", "#### Tolerance rules that changed the verdict", ""]
        lines += [("  - " if line.startswith("  ") else "- ") + _code(line.strip()) for line in applied]
    if step_times is not None:
        rows = table_rows(step_times)
        summary = "step times, seconds (golden -> this run; informational, not gated)"
        lines += ["", f"<details><summary>{summary}</summary>", "", _row(rows[0]), _row(["---"] * len(rows[0]))]
        lines += [_row(row) for row in rows[1:]] + ["", "</details>"]
    if verdict.divergences:
        lines += ["", "#### First divergence (execution order: step, phase, rank)", ""]
        for n, d in enumerate(verdict.divergences[:limit], 1):
            f = d.cause
            lines.append(f"{n}. **{STATUS_WORD[f.status]}** {_code(location(f))}")
            pos = position_text(f)
            if pos:
                lines.append(f"   - {_code(pos)}")
            lines.append(f"   - golden: {_code(value_text(f.golden, f.actual))}")
            lines.append(f"   - actual: {_code(value_text(f.actual, f.golden))}")
            lines.append(f"   - {consequences_text(d)}")
        if len(verdict.divergences) > limit:
            lines += ["", f"... and {len(verdict.divergences) - limit} more cause(s) (see the JSON verdict)"]
    for name in sorted(verdict.surfaces):
        findings = verdict.surfaces[name].findings
        if not findings:
            continue
        lines += ["", f"<details><summary>{name}: {len(findings)} finding(s)</summary>", "",
                  _row(HEADER), _row(["---"] * len(HEADER))]
        lines.extend(_row(finding_row(f, _MARK)) for f in findings[:limit])
        if len(findings) > limit:
            lines += ["", f"... and {len(findings) - limit} more (see the JSON verdict)"]
        lines += ["", "</details>"]
    lines += provenance_markdown(provenance)
    return "\n".join(lines) + "\n"
