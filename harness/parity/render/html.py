"""Static HTML report: one self-contained file that opens in a browser with no server.

Inline CSS and inline SVG only: no external URL, no script (a Content-Security-Policy
meta tag forbids both, so a value that slipped through escaping still could not run
or fetch anything). Every value taken from the verdict or the surfaces is escaped.

Layout: a header (verdict status, counts, lane mode), the provenance block (the
golden's provenance and the run's id, when given; ``html_provenance``), a per-surface
summary table, the causes in execution order (first divergence first, each with its
consequences counted and listed collapsed), a section x step map per surface with
findings (``html_map``), training curves (``html_curves``: ``loss``, ``reward``, ``grad_norm`` per step
from the ``training`` surface's ``stepNNNN`` -> ``metrics``; golden dashed, actual solid,
points with a training finding ringed red) when surface documents are given, then one
findings table per surface: gated surfaces first and open, informational ones after
them and collapsed (capped at ``limit`` rows; the JSON verdict is complete). Values are
full and wrapped; a long list shows a window around the differing element, marked.
A parity verdict has no findings tables.

The output is a pure function of the arguments (no timestamps), like the other renderers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from harness.parity.findings import Finding, Verdict
from harness.parity.render.bounded import bounded_document, bounded_step_times, bounded_verdict
from harness.parity.render.common import (
    STATUS_WORD,
    VERDICT_WORD,
    consequences_text,
    coords_cell,
    location,
    number_cell,
    position_text,
    rules_applied_lines,
    segments,
    summary_line,
)
from harness.parity.render.common import escape_html as _e
from harness.parity.render.html_curves import CURVE_METRICS, curves
from harness.parity.render.html_map import MAP_CSS, rank_step_maps
from harness.parity.render.html_provenance import provenance_block
from harness.parity.step_times import StepTimes, table_rows

__all__ = ["render_html", "CURVE_METRICS"]


_CSS = """
:root{--fail:#c62828;--stale:#b26a00;--info:#00838f;--parity:#2e7d32;--golden:#5c6bc0;--actual:#ef6c00;
--line:#d0d7de;--muted:#57606a;--bg-alt:#f6f8fa}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1f2328;background:#fff}
main{max-width:1400px;margin:0 auto;padding:0 24px 48px}
header.verdict{padding:20px 24px;border-bottom:4px solid var(--line);margin-bottom:20px}
header.status-fail{border-color:var(--fail);background:#fdecea}
header.status-stale{border-color:var(--stale);background:#fff4e0}
header.status-parity{border-color:var(--parity);background:#e8f5e9}
h1{font-size:20px;margin:0 0 8px;word-break:break-all}
h2{font-size:17px;margin:28px 0 8px}
h3{font-size:14px;margin:0 0 4px}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-weight:700;color:#fff;font-size:13px;
letter-spacing:.03em;vertical-align:middle}
.badge.fail{background:var(--fail)}.badge.stale{background:var(--stale)}.badge.info{background:var(--info)}
.badge.parity{background:var(--parity)}
.counts{display:flex;flex-wrap:wrap;gap:8px;margin:10px 0 4px;padding:0;list-style:none}
.counts li{background:#fff;border:1px solid var(--line);border-radius:6px;padding:4px 10px}
.counts b{font-size:16px}
.summary{color:var(--muted);margin:6px 0 0}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
th{background:var(--bg-alt);position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.val,td.key,td.sec{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
td.val{min-width:9em;max-width:420px}
td.key{overflow-wrap:anywhere;min-width:12em}
td.sec{white-space:nowrap}
tr.fail td:first-child{border-left:4px solid var(--fail)}
tr.stale td:first-child{border-left:4px solid var(--stale)}
tr.info td:first-child{border-left:4px solid var(--info)}
tr.parity td:first-child{border-left:4px solid var(--parity)}
td.st{font-weight:700;white-space:nowrap}
tr.fail td.st{color:var(--fail)}tr.stale td.st{color:var(--stale)}tr.info td.st{color:var(--info)}
tr.parity td.st{color:var(--parity)}
table.summary-table{width:auto;min-width:640px}
div.v{white-space:pre-wrap;overflow-wrap:anywhere;max-height:320px;overflow:auto}
mark{background:#ffe08a;color:inherit;font-weight:700;padding:0 1px}
.coords-golden{color:var(--muted)}
section.causes ol{padding-left:24px}
li.cause{margin:0 0 14px;padding:8px 10px;border:1px solid var(--line);border-left:5px solid var(--fail);
border-radius:4px;background:#fff}
li.cause.stale{border-left-color:var(--stale)}
li.cause .loc{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-weight:600;overflow-wrap:anywhere}
li.cause .pos{margin:4px 0}
li.cause table{width:auto;margin:4px 0}
li.cause details summary{cursor:pointer;color:var(--muted)}
li.cause details ul{margin:4px 0;font-family:ui-monospace,monospace;font-size:12px}
.prov-cols{display:flex;flex-wrap:wrap;gap:24px}
dl.prov{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:4px 0;font-size:13px}
dl.prov dt{font-weight:600}dl.prov dd{margin:0;font-family:ui-monospace,monospace;overflow-wrap:anywhere}
details.info-surfaces>summary{cursor:pointer;font-size:16px;font-weight:600;padding:6px 0;color:var(--info)}
details.surface{margin:0 0 16px}
details.surface>summary{cursor:pointer;font-size:16px;font-weight:600;padding:6px 0}
.note{color:var(--muted);font-size:13px;margin:6px 0}
.ok{color:var(--parity);font-weight:600}
.curves{display:flex;flex-wrap:wrap;gap:16px}
figure.curve{margin:0;border:1px solid var(--line);border-radius:6px;padding:8px 10px;background:#fff}
figure.curve figcaption{font-weight:600;margin-bottom:2px}
svg text{font:11px system-ui,sans-serif;fill:#57606a}
svg .grid{stroke:#eaeef2;stroke-width:1}
svg .axis{stroke:#8c959f;stroke-width:1}
svg polyline{fill:none;stroke-width:2;stroke-linejoin:round}
svg .golden{stroke:var(--golden);stroke-dasharray:6 4}
svg .actual{stroke:var(--actual)}
svg circle.golden{fill:var(--golden);stroke:none}
svg circle.actual{fill:var(--actual);stroke:none}
svg circle.differs{fill:none;stroke:var(--fail);stroke-width:2}
svg circle.differs.stale{stroke:var(--stale)}svg circle.differs.info{stroke:var(--info)}
footer{color:var(--muted);font-size:12px;margin-top:32px}
""" + MAP_CSS


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _value_html(value: Any, other: Any = None) -> str:
    """The full value, wrapped; a long list as a window around its differing element (marked)."""
    parts = "".join(f"<mark>{_e(t)}</mark>" if marked else _e(t) for t, marked in segments(value, other))
    return f'<div class="v">{parts}</div>'


def _tolerance_text(f: Finding) -> str:
    tol = f.tolerance
    if not isinstance(tol, Mapping):
        return ""
    parts = [f"{k} {tol[k]}" for k in ("abs", "rel", "when") if k in tol]
    if "inside" in tol:
        parts.append("inside band" if tol["inside"] else "outside band")
    if tol.get("reason"):
        parts.append(str(tol["reason"]))
    return "tolerance: " + ", ".join(parts)


_FINDING_HEADER = ["status", "section", "coords", "phase/step", "key", "kind", "golden", "actual",
                   "abs err", "rel err", "lane"]


def _coords_html(f: Finding) -> str:
    text = _e(coords_cell(f.coords))
    if f.golden_coords:
        text += f'<div class="coords-golden">golden: {_e(coords_cell(f.golden_coords))}</div>'
    return text


def _finding_row(f: Finding, anchor: str) -> str:
    tol = _tolerance_text(f)
    lane_title = f' title="{_e(tol)}"' if tol else ""
    note = f'<div class="note">{_e(f.note)}</div>' if f.note else ""
    pos = position_text(f)
    pos_html = f'<div class="note">{_e(pos)}</div>' if pos else ""
    cells = [
        f'<td class="st" id="{_e(anchor)}">{_e(STATUS_WORD.get(f.status, f.status))}</td>',
        f'<td class="sec">{_e(f.section or "(surface)")}</td>',
        f"<td>{_coords_html(f)}</td>",
        f"<td>{_e(f.phase or '')}</td>",
        f'<td class="key">{_e(f.key or "/")}{pos_html}{note}</td>',
        f"<td>{_e(f.kind)}</td>",
        f'<td class="val">{_value_html(f.golden, f.actual)}</td>',
        f'<td class="val">{_value_html(f.actual, f.golden)}</td>',
        f'<td class="num">{_e(number_cell(f.abs_err))}</td>',
        f'<td class="num">{_e(number_cell(f.rel_err))}</td>',
        f"<td{lane_title}>{_e(f.lane)}</td>",
    ]
    return f'<tr class="finding {_e(f.status)}">' + "".join(cells) + "</tr>"


def _link(anchors: Mapping[int, str], f: Finding, text: str) -> str:
    """``text`` linked to the finding's row, or plain when the row is beyond the limit."""
    target = anchors.get(id(f))
    return f'<a href="#{_e(target)}">{_e(text)}</a>' if target else _e(text)


def _causes(verdict: Verdict, anchors: Mapping[int, str], limit: int) -> list[str]:
    """The causes in execution order, each with both values and its consequences (collapsed)."""
    if not verdict.divergences:
        return []
    out = ['<section id="causes" class="causes"><h2>First divergence</h2>',
           ('<p class="note">Gated findings in execution order (step, phase, rank); findings that follow from '
            "an earlier one are listed under it as consequences (docs/gate.md, First divergence first).</p><ol>")]
    for n, d in enumerate(verdict.divergences[:limit], 1):
        f = d.cause
        pos = position_text(f)
        out.append(f'<li class="cause {_e(f.status)}" id="cause-{n}" data-surface="{_e(f.surface)}" '
                   f'data-section="{_e(f.section or "")}" data-phase="{_e(f.phase or "")}" data-key="{_e(f.key)}" '
                   f'data-kind="{_e(f.kind)}">')
        out.append(f'<div class="loc">{_link(anchors, f, STATUS_WORD.get(f.status, f.status))} '
                   f"{_e(location(f))}</div>")
        if pos:
            out.append(f'<div class="pos">{_e(pos)}</div>')
        out.append(f"<table><tbody><tr><th>golden</th><td class=\"val\">{_value_html(f.golden, f.actual)}</td></tr>"
                   f"<tr><th>actual</th><td class=\"val\">{_value_html(f.actual, f.golden)}</td></tr></tbody></table>")
        if d.consequences:
            out.append(f"<details><summary>{_e(consequences_text(d))}</summary><ul>")
            for rule, c in d.consequences[:limit]:
                out.append(f"<li>{_link(anchors, c, rule)}: {_e(location(c))}</li>")
            if len(d.consequences) > limit:
                out.append(f"<li>… and {len(d.consequences) - limit} more</li>")
            out.append("</ul></details>")
        else:
            out.append('<div class="note">no consequences</div>')
        out.append("</li>")
    out.append("</ol>")
    if len(verdict.divergences) > limit:
        out.append(f'<p class="note">… and {len(verdict.divergences) - limit} more cause(s).</p>')
    out.append("</section>")
    return out


def _surface_status(s) -> tuple[str, str]:
    """(text, css class) of a surface's status; a parity surface with informational findings says so."""
    if s.status == "parity" and s.findings:
        return "parity (info)", "info"
    return s.status, s.status


def _surface_table(s, name: str, anchors: Mapping[int, str], limit: int, is_open: bool) -> list[str]:
    findings = s.findings
    out = [(f'<details class="surface" id="{_anchor(name)}"{" open" if is_open else ""}><summary>{_e(name)}: '
            f"{len(findings)} finding(s) in {s.sections_differing} section(s) "
            f'<span class="badge {_e(_surface_status(s)[1])}">{_e(_surface_status(s)[0])}</span></summary>')]
    stale = next((f for f in findings if f.status == "stale"), None)
    if stale is not None:
        out.append(f'<p class="note">Stale-golden findings fail the exact lane but are inside their '
                   f"tolerance band ({_e(_tolerance_text(stale))}): probable stale golden.</p>")
    out.append('<table class="findings"><thead><tr>' + "".join(f"<th>{h}</th>" for h in _FINDING_HEADER)
               + "</tr></thead><tbody>")
    out.extend(_finding_row(f, anchors[id(f)]) for f in findings[:limit])
    out.append("</tbody></table>")
    if len(findings) > limit:
        out.append(f'<p class="note">… and {len(findings) - limit} more (the JSON verdict lists all).</p>')
    out.append("</details>")
    return out


def _anchor(name: str) -> str:
    return "surface-" + re.sub(r"[^A-Za-z0-9_-]", "_", name)



# ---------------------------------------------------------------- the page

def _step_times_section(times: StepTimes | None) -> list[str]:
    """The per-step phase times, golden beside run (nothing when not given)."""
    if times is None:
        return []
    header, *rows = table_rows(times)
    out = ['<section id="step-times"><h2>Step times, seconds (golden &rarr; this run; informational, not gated)</h2>',
           '<table class="summary-table"><thead><tr>' + "".join(f"<th>{_e(c)}</th>" for c in header)
           + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(f'<td class="num">{_e(c)}</td>' for c in row) + "</tr>" for row in rows]
    return out + ["</tbody></table></section>"]


def _spec_section(verdict: Verdict) -> str:
    """The first finding when the run's workload spec is not the golden's (``Verdict.spec``)."""
    spec = verdict.spec
    if spec is None:
        return ""
    items = "".join(f"<li><code>{_e(change)}</code></li>" for change in spec.changes)
    return (f'<section id="spec" class="causes"><h2>Workload spec differs from the golden\'s</h2>'
            f'<p class="{spec.status}"><b>{"FAIL" if spec.gating else "NOTE"}</b> {_e(spec.headline)}</p>'
            + (f"<ul>{items}</ul>" if items else "")
            + "</section>")


def render_html(verdict: Verdict, *, title: str = "golden parity", surfaces_actual: Mapping | None = None,
                surfaces_golden: Mapping | None = None, limit: int = 500,
                metrics: Sequence[str] = CURVE_METRICS, provenance: Mapping | None = None,
                run: Mapping | None = None, step_times: StepTimes | None = None) -> str:
    """The report as one HTML document (a string). Surfaces are {name: document} mappings;
    ``provenance`` is the golden's PROVENANCE.json and ``run`` the run's fields (``run_id``),
    shown near the top (``html_provenance.provenance_block``); ``step_times`` (informational)
    is a table below the surface table."""
    verdict, provenance = bounded_verdict(verdict), bounded_document(provenance)  # issue 41: bounded output
    step_times = bounded_step_times(step_times)
    status = verdict.status
    counts = verdict.counts()
    names = sorted(verdict.surfaces)
    compared = sum(verdict.surfaces[n].sections_compared for n in names)
    differing = sum(verdict.surfaces[n].sections_differing for n in names)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}: {_e(VERDICT_WORD.get(status, status))}</title>",
        f"<style>{_CSS}</style></head><body>",
        f'<header class="verdict status-{_e(status)}"><h1>{_e(title)}</h1>',
        (f'<div><span class="badge {_e(status)}" id="verdict-status" data-status="{_e(status)}">'
         f"{_e(VERDICT_WORD.get(status, status))}</span></div>"),
        '<ul class="counts">',
        f'<li class="count-fail">failing <b>{counts["fail"]}</b></li>',
        f'<li class="count-stale">stale-golden <b>{counts["stale"]}</b></li>',
        f'<li class="count-info">informational <b>{counts["info"]}</b></li>',
        f"<li>surfaces <b>{len(names)}</b></li>",
        f"<li>sections compared <b>{compared}</b>, differing <b>{differing}</b></li>",
        "</ul>",
        f'<p class="summary">{_e(summary_line(verdict))}</p>',
        "</header><main>",
        _spec_section(verdict),
        provenance_block(provenance, run),
        ('<section id="summary"><h2>Surfaces</h2><table class="summary-table"><thead><tr>'
         "<th>surface</th><th>gated</th><th>status</th><th>sections</th><th>differing</th><th>findings</th>"
         "</tr></thead><tbody>"),
    ]
    for name in names:
        s = verdict.surfaces[name]
        shown, css = _surface_status(s)
        label = f'<a href="#{_anchor(name)}">{_e(name)}</a>' if s.findings else _e(name)
        out.append(f'<tr class="surface {_e(css)}"><td>{label}</td><td>{"yes" if s.gated else "info"}</td>'
                   f'<td class="st">{_e(shown)}</td><td class="num">{s.sections_compared}</td>'
                   f'<td class="num">{s.sections_differing}</td><td class="num">{len(s.findings)}</td></tr>')
    out.append("</tbody></table></section>")
    applied = rules_applied_lines(verdict)
    if applied:
        out.append('<section id="tolerances-applied"><h2>Tolerance rules that changed the verdict</h2><ul>')
        out.extend(f'<li class="{"absorbed" if line.startswith("  ") else "rule"}"><code>{_e(line.strip())}</code></li>'
                   for line in applied)
        out.append("</ul></section>")
    out.extend(_step_times_section(step_times))
    anchors = {id(f): f"f-{_anchor(name)[len('surface-'):]}-{i}"
               for name in names for i, f in enumerate(verdict.surfaces[name].findings[:limit])}
    out.extend(_causes(verdict, anchors, limit))
    out.extend(rank_step_maps(verdict, anchors))
    out.extend(curves(verdict, surfaces_actual, surfaces_golden, metrics))
    out.append('<section id="findings"><h2>Findings</h2>')
    if not verdict.findings:
        out.append('<p class="ok">No findings: every compared section matches the golden.</p>')
    gated = [n for n in names if verdict.surfaces[n].findings and verdict.surfaces[n].gated]
    informational = [n for n in names if verdict.surfaces[n].findings and not verdict.surfaces[n].gated]
    for group, is_open in ((gated, True), (informational, False)):
        if not group:
            continue
        if not is_open:
            total = sum(len(verdict.surfaces[n].findings) for n in group)
            out.append(f'<details class="info-surfaces" id="informational"><summary>Informational (not gated): '
                       f"{total} finding(s) on {_e(', '.join(group))}</summary>")
        for name in group:
            out.extend(_surface_table(verdict.surfaces[name], name, anchors, limit, is_open))
        if not is_open:
            out.append("</details>")
    out.append("</section>")
    out.append('<footer>Static report of the golden regression gate (harness.parity.render.html); '
               "JSON verdict: <code>--format json</code>.</footer>")
    out.append("</main></body></html>")
    return "\n".join(out) + "\n"
