"""Rank x step maps of the HTML report: which sections and steps differ, per surface.

One table per surface with findings: a row per section (the step part of a section
id such as ``step0002-attempt1-row0003`` taken out, so a rollout row is one row), a
column per step in execution order (``pre``: topology and whole-surface findings,
``init``: engine start-up). A cell is coloured by the worst status of its findings,
outlined when it holds a cause, and links to its first finding (``anchors``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from harness.parity.divergence import execution_point
from harness.parity.findings import Finding, Verdict, natural_key
from harness.parity.render.common import escape_html as _e

__all__ = ["rank_step_maps", "MAP_CSS"]

MAP_CSS = """
table.rankmap{width:auto;border-collapse:collapse;margin:4px 0 14px}
table.rankmap td,table.rankmap th{border:1px solid var(--line);padding:0;min-width:34px;height:22px;text-align:center;
font-size:12px}
table.rankmap th.row{text-align:left;padding:0 6px;font-family:ui-monospace,monospace;font-weight:400}
table.rankmap td a{display:block;width:100%;height:100%;line-height:22px;color:#fff;text-decoration:none;
font-weight:700}
table.rankmap td.fail{background:var(--fail)}table.rankmap td.stale{background:var(--stale)}
table.rankmap td.info{background:var(--info)}table.rankmap td.same{background:#eef6ee}
table.rankmap td.cause{outline:3px solid #1f2328;outline-offset:-3px}
"""

_RANK = {"info": 0, "stale": 1, "fail": 2}
_STEP_PART = re.compile(r"^step0*\d+-?")


def _column(step: int) -> str:
    return "pre" if step < 0 else ("init" if step == 0 else str(step))


def _row(f: Finding) -> str:
    section = f.section or "(surface)"
    rest = _STEP_PART.sub("", section)
    return rest or ("metrics" if f.surface == "training" else section)


def rank_step_maps(verdict: Verdict, anchors: Mapping[int, str]) -> list[str]:
    """HTML of the maps; ``anchors`` maps ``id(finding)`` to its row's element id."""
    causes = {id(d.cause) for d in verdict.divergences}
    out = []
    for name in sorted(verdict.surfaces, key=lambda n: (not verdict.surfaces[n].gated, n)):
        findings = verdict.surfaces[name].findings
        if not findings:
            continue
        cells: dict[tuple[str, int], list[Finding]] = {}
        for f in sorted(findings, key=execution_point):
            cells.setdefault((_row(f), execution_point(f)[0]), []).append(f)
        rows = sorted({r for r, _ in cells}, key=natural_key)
        steps = sorted({s for _, s in cells})
        head = "".join(f"<th>{_e(_column(s))}</th>" for s in steps)
        out.append(f'<h3 id="map-{_e(name)}">{_e(name)}</h3><table class="rankmap" data-surface="{_e(name)}">'
                   f"<thead><tr><th></th>{head}</tr></thead><tbody>")
        for r in rows:
            tds = []
            for s in steps:
                group = cells.get((r, s))
                if not group:
                    tds.append('<td class="same"></td>')
                    continue
                worst = max(group, key=lambda f: _RANK.get(f.status, 0)).status
                cause = " cause" if any(id(f) in causes for f in group) else ""
                target = next((anchors[id(f)] for f in group if id(f) in anchors), None)
                label = f'<a href="#{_e(target)}">{len(group)}</a>' if target else str(len(group))
                tds.append(f'<td class="{_e(worst)}{cause}" data-row="{_e(r)}" data-step="{_e(_column(s))}" '
                           f'title="{_e(r)} step {_e(_column(s))}: {len(group)} finding(s)">{label}</td>')
            out.append(f'<tr><th class="row">{_e(r)}</th>{"".join(tds)}</tr>')
        out.append("</tbody></table>")
    if not out:
        return []
    return ['<section id="maps"><h2>Where the runs differ (section x step)</h2>',
            ('<p class="note">A cell per section and step: colour by the worst status of its findings, '
             "outlined when it holds a cause; the number links to its first finding.</p>"), *out, "</section>"]
