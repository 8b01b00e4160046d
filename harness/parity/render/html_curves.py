"""Training curves of the HTML report, as inline SVG (``html.render_html`` places them).

``curves`` draws one plot per metric (``CURVE_METRICS``: ``loss``, ``reward``,
``grad_norm``) from the ``training`` surface's ``stepNNNN`` -> ``metrics``: golden
dashed, actual solid, a point with a training finding ringed in its status colour.
Every value is escaped; the output is a pure function of the arguments.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from harness.parity.findings import Verdict
from harness.parity.render.common import STATUS_WORD
from harness.parity.render.common import escape_html as _e

__all__ = ["CURVE_METRICS", "curves"]

CURVE_METRICS = ("loss", "reward", "grad_norm")

_MARKERS = 120       # point markers on a curve up to this many steps


def _training_doc(surfaces: Any) -> Mapping | None:
    """The training document of a {name: doc} mapping (or a training document itself)."""
    if not isinstance(surfaces, Mapping):
        return None
    doc = surfaces if surfaces.get("surface") == "training" else surfaces.get("training")
    if isinstance(doc, Mapping) and isinstance(doc.get("sections"), Mapping):
        return doc
    return None


def _step_of(section_id: str, body: Mapping) -> int | None:
    step = body.get("step")
    if isinstance(step, int) and not isinstance(step, bool):
        return step
    m = re.fullmatch(r"step0*(\d+)", section_id)
    return int(m.group(1)) if m else None


def _series(doc: Mapping | None, metric: str) -> list[tuple[int, float]]:
    """Sorted (step, value) points of one metric; non-numeric and non-finite values skipped."""
    if doc is None:
        return []
    points = []
    for sid, body in doc["sections"].items():
        if not isinstance(body, Mapping) or not isinstance(body.get("metrics"), Mapping):
            continue
        step = _step_of(str(sid), body)
        value = body["metrics"].get(metric)
        if step is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            points.append((step, float(value)))
    return sorted(points)


def _metric_name(docs: Sequence[Mapping | None], wanted: str) -> str | None:
    """``wanted`` itself, else the one metric whose last ``/`` component is ``wanted``."""
    names: set[str] = set()
    for doc in docs:
        if doc is None:
            continue
        for body in doc["sections"].values():
            if isinstance(body, Mapping) and isinstance(body.get("metrics"), Mapping):
                names.update(str(k) for k in body["metrics"])
    if wanted in names:
        return wanted
    tails = sorted(n for n in names if n.rsplit("/", 1)[-1] == wanted)
    return tails[0] if tails else None


def _nice_ticks(lo: float, hi: float, target: int = 6) -> tuple[list[float], int | None]:
    """Round tick values covering [lo, hi] (steps of 1, 2, 2.5 or 5 x 10^k) and the decimals to print
    them with (None: use general format). ``lo < hi``."""
    raw = (hi - lo) / (target - 1)
    exp = math.floor(math.log10(raw))
    mag = 10.0 ** exp
    mult = next(m for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= raw * (1 - 1e-12))
    if mult == 10.0:
        mult, exp, mag = 1.0, exp + 1, mag * 10
    step = mult * mag
    start, end = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    ticks = [i * step for i in range(start, end + 1)]
    decimals = max(0, -exp + (1 if mult == 2.5 else 0))
    big = max(abs(ticks[0]), abs(ticks[-1]))
    return ticks, (decimals if decimals <= 8 and big < 1e6 else None)


def _tick_label(value: float, decimals: int | None) -> str:
    if decimals is None:
        return f"{value:.4g}"
    text = f"{value:.{decimals}f}"
    return "0" if float(text) == 0 else text


_RANK = {"info": 0, "stale": 1, "fail": 2}


def _plot(metric: str, series: list[tuple[str, list[tuple[int, float]]]], differing: Mapping[int, str]) -> str:
    """One SVG line chart; ``series`` = [(css class / label, points)], non-empty point lists only;
    ``differing`` = {step: status} of the steps with a finding on this metric (ringed)."""
    w, h, left, right, top, bottom = 440, 250, 64, 12, 30, 40
    pw, ph = w - left - right, h - top - bottom
    steps = [s for _, pts in series for s, _ in pts]
    values = [v for _, pts in series for _, v in pts]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(values), max(values)
    if y1 == y0:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    yticks, decimals = _nice_ticks(y0, y1)
    y0, y1 = yticks[0], yticks[-1]

    def sx(step: float) -> float:
        return left + (pw / 2 if x1 == x0 else (step - x0) / (x1 - x0) * pw)

    def sy(value: float) -> float:
        return top + (y1 - value) / (y1 - y0) * ph

    out = [(f'<svg class="plot" data-metric="{_e(metric)}" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
            f'role="img" aria-label="{_e(metric)} per step">')]
    for yv in yticks:
        y = sy(yv)
        out.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(_tick_label(yv, decimals))}</text>')
    xticks = sorted(set(steps))
    if len(xticks) > 10:
        stride = math.ceil(len(xticks) / 10)
        xticks = xticks[::stride] + ([xticks[-1]] if xticks[-1] not in xticks[::stride] else [])
    for xv in xticks:
        x = sx(xv)
        out.append(f'<line class="axis" x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 4}"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{_e(xv)}</text>')
    out.append(f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}"/>')
    out.append(f'<line class="axis" x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}"/>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{h - 6}" text-anchor="middle">step</text>')
    for cls, pts in sorted(series, key=lambda item: item[0] == "golden"):  # golden (dashed) on top
        coords = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in pts)
        out.append(f'<polyline class="{cls}" data-series="{cls}" data-points="{len(pts)}" points="{coords}"/>')
        for s, v in (pts if len(pts) <= _MARKERS else ()):
            out.append(f'<circle class="{cls}" cx="{sx(s):.1f}" cy="{sy(v):.1f}" r="2.5">'
                       f"<title>{_e(cls)} step {_e(s)}: {_e(repr(v))}</title></circle>")
    actual = dict(series).get("actual", [])
    for s, v in actual:
        if s in differing:
            out.append(
                f'<circle class="differs {_e(differing[s])}" cx="{sx(s):.1f}" cy="{sy(v):.1f}" r="6">'
                f"<title>{_e(STATUS_WORD.get(differing[s], differing[s]))} finding at step {_e(s)}</title></circle>"
            )
    # legend
    lx = left
    for cls, _ in series:
        out.append(f'<line class="{cls}" x1="{lx}" y1="10" x2="{lx + 22}" y2="10" style="stroke-width:2"/>')
        out.append(f'<text x="{lx + 26}" y="14">{cls}</text>')
        lx += 80
    if actual:
        for status in sorted(set(differing.values()), key=lambda st: -_RANK.get(st, 0)):
            out.append(f'<circle class="differs {_e(status)}" cx="{lx + 6}" cy="10" r="5"/>'
                       f'<text x="{lx + 16}" y="14">{_e(STATUS_WORD.get(status, status))}</text>')
            lx += 70
    out.append("</svg>")
    return "".join(out)


def curves(verdict: Verdict, surfaces_actual: Any, surfaces_golden: Any, metrics: Sequence[str]) -> list[str]:
    golden_doc, actual_doc = _training_doc(surfaces_golden), _training_doc(surfaces_actual)
    if golden_doc is None and actual_doc is None:
        return []
    differing: dict[str, dict[int, str]] = {}   # metric -> {step: worst status}
    training = verdict.surfaces.get("training")
    for f in (training.findings if training else []):
        m = re.fullmatch(r"step0*(\d+)", f.phase or "")
        if m and f.key.startswith("/metrics/"):
            steps = differing.setdefault(f.key[len("/metrics/"):].replace("~1", "/").replace("~0", "~"), {})
            step = int(m.group(1))
            if _RANK.get(f.status, 0) > _RANK.get(steps.get(step, ""), -1):
                steps[step] = f.status
    sides = "golden (dashed) vs actual (solid)" if golden_doc is not None and actual_doc is not None else (
        "golden only" if actual_doc is None else "actual only")
    out = ['<section id="curves"><h2>Training curves</h2>',
           (f'<p class="note">Per-step metrics from the training surface: {_e(sides)}. '
            "Rings mark steps with a finding on that metric (red: fail, amber: probable stale golden).</p>"),
           '<div class="curves">']
    for wanted in metrics:
        name = _metric_name([golden_doc, actual_doc], wanted)
        series = []
        if name is not None:
            for cls, doc in (("golden", golden_doc), ("actual", actual_doc)):
                pts = _series(doc, name)
                if pts:
                    series.append((cls, pts))
        out.append(f'<figure class="curve"><figcaption>{_e(name or wanted)}</figcaption>')
        if series:
            out.append(_plot(name, series, differing.get(name, {})))
        else:
            out.append(f'<p class="note">no numeric {_e(wanted)} metric in the training surface</p>')
        out.append("</figure>")
    out.append("</div></section>")
    return out
