"""Markdown renderer for a CI job summary (GitHub ``$GITHUB_STEP_SUMMARY`` and alike)."""

from __future__ import annotations

from harness.parity.findings import Verdict
from harness.parity.render.common import HEADER, finding_row, summary_line
from harness.parity.render.provenance import provenance_markdown


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or " "


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def render_markdown(verdict: Verdict, *, title: str = "golden parity", limit: int = 50,
                    provenance: dict | None = None) -> str:
    lines = [f"### {title}", "", f"**{summary_line(verdict)}**", "",
             _row(["surface", "gated", "status", "sections", "differing", "findings"]),
             _row(["---"] * 6)]
    for name in sorted(verdict.surfaces):
        s = verdict.surfaces[name]
        lines.append(_row([name, "yes" if s.gated else "info", f"**{s.status}**" if s.status != "parity" else s.status,
                           str(s.sections_compared), str(s.sections_differing), str(len(s.findings))]))
    for name in sorted(verdict.surfaces):
        findings = verdict.surfaces[name].findings
        if not findings:
            continue
        lines += ["", f"<details><summary>{name}: {len(findings)} finding(s)</summary>", "",
                  _row(HEADER), _row(["---"] * len(HEADER))]
        lines.extend(_row(finding_row(f)) for f in findings[:limit])
        if len(findings) > limit:
            lines += ["", f"... and {len(findings) - limit} more (see the JSON verdict)"]
        lines += ["", "</details>"]
    lines += provenance_markdown(provenance)
    return "\n".join(lines) + "\n"
