"""Verdict renderers: terminal table, Markdown (CI job summary), JUnit XML, JSON, static HTML.

Every renderer is a pure function ``render_<format>(verdict, *, title=...) -> str``;
``render(verdict, fmt)`` dispatches by name. Human formats cap the findings shown
per surface (``limit``) and say how many were left out; JSON is always complete.
HTML also plots the training curves when given the surface documents
(``surfaces_actual`` / ``surfaces_golden``, {name: document}); the other formats ignore them.
Given the golden's provenance, every format adds a provenance block (``render.provenance``);
HTML also shows the ``run``'s fields (``run_id``). Every format lists the causes first, in
execution order (``harness.parity.divergence``), with full values.
"""

from __future__ import annotations

from harness.parity.findings import Verdict
from harness.parity.render.html import render_html
from harness.parity.render.json_verdict import render_json
from harness.parity.render.junit import render_junit
from harness.parity.render.markdown import render_markdown
from harness.parity.render.terminal import render_terminal
from harness.parity.step_times import StepTimes

FORMATS = ("terminal", "markdown", "json", "junit", "html")

__all__ = ["FORMATS", "render", "render_html", "render_json", "render_junit", "render_markdown", "render_terminal"]


def render(verdict: Verdict, fmt: str, *, title: str = "golden parity", color: bool | None = None,
           surfaces_actual: dict | None = None, surfaces_golden: dict | None = None, show_info: bool = False,
           provenance: dict | None = None, run: dict | None = None, step_times: StepTimes | None = None) -> str:
    """``provenance``: the golden's PROVENANCE.json; every format then shows what produced it.
    ``run``: the run's fields for the HTML provenance block (``run_id``). ``step_times``
    (``harness.parity.step_times``): terminal, Markdown, JSON and HTML show them beside
    the verdict; they never change it."""
    if fmt == "terminal":
        return render_terminal(verdict, title=title, color=color, show_info=show_info, provenance=provenance,
                               step_times=step_times)
    if fmt == "markdown":
        return render_markdown(verdict, title=title, provenance=provenance, step_times=step_times)
    if fmt == "json":
        return render_json(verdict, title=title, provenance=provenance, step_times=step_times)
    if fmt == "junit":
        return render_junit(verdict, title=title, provenance=provenance)
    if fmt == "html":
        return render_html(verdict, title=title, surfaces_actual=surfaces_actual, surfaces_golden=surfaces_golden,
                           provenance=provenance, run=run, step_times=step_times)
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
