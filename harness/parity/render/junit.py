"""JUnit XML renderer: one testcase per surface; failures carry their findings.

Failing and stale-golden surfaces are ``<failure>`` (stale with type
``probable-stale-golden``); informational findings go to ``<system-out>``. Values are
full (a long list: a window around the differing element, marked ``>>x<<``). The
suite's ``<system-out>`` lists the causes in execution order with their consequences
counted (first divergence first); a failing surface's message names the first cause
found on it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from harness.parity.findings import Verdict
from harness.parity.render.bounded import bounded_document, bounded_verdict
from harness.parity.render.common import (
    HEADER,
    consequences_text,
    finding_row,
    lane_text,
    location,
    position_text,
    rules_applied_lines,
)
from harness.parity.render.provenance import provenance_properties


def _finding_lines(findings) -> str:
    return "\n".join("; ".join(f"{h}={c}" for h, c in zip(HEADER, finding_row(f)) if c) for f in findings)


def _cause_lines(verdict: Verdict) -> str:
    out = []
    for n, d in enumerate(verdict.divergences, 1):
        f = d.cause
        pos = position_text(f)
        out.append(f"{n}. {location(f)}" + (f"; {pos}" if pos else ""))
        out.append("   " + "; ".join(f"{h}={c}" for h, c in zip(HEADER, finding_row(f)) if c))
        out.append(f"   {consequences_text(d)}")
    return "\n".join(out)


def render_junit(verdict: Verdict, *, title: str = "golden parity", provenance: dict | None = None) -> str:
    verdict, provenance = bounded_verdict(verdict), bounded_document(provenance)  # issue 41: bounded output
    cases = sorted(verdict.surfaces)
    failures = sum(verdict.surfaces[n].status != "parity" for n in cases)
    suite = ET.Element("testsuite", name=title, tests=str(len(cases)), failures=str(failures), errors="0", skipped="0")
    properties = provenance_properties(provenance)
    if properties is not None:  # JUnit: <properties> comes first in a testsuite
        suite.append(properties)
    if verdict.spec is not None and verdict.spec.gating:  # the first testcase: the spec (harness.parity.spec_check)
        suite.set("tests", str(len(cases) + 1))
        suite.set("failures", str(failures + 1))
        case = ET.SubElement(suite, "testcase", classname=f"golden.{title.replace(' ', '_')}", name="spec")
        ET.SubElement(case, "failure", type="spec-differs", message=verdict.spec.headline).text = "\n".join(
            verdict.spec.lines())
    for name in cases:
        s = verdict.surfaces[name]
        case = ET.SubElement(suite, "testcase", classname=f"golden.{title.replace(' ', '_')}", name=name)
        gating = [f for f in s.findings if f.status in ("fail", "stale")]
        if gating:
            kind = "parity-failure" if s.status == "fail" else "probable-stale-golden"
            first = next((d.cause for d in verdict.divergences if d.cause.surface == name), None)
            message = f"{name}: {len(gating)} finding(s) in {s.sections_differing} section(s)"
            if first is not None:
                message += f"; first cause: {location(first)}"
            failure = ET.SubElement(case, "failure", type=kind, message=message)
            failure.text = _finding_lines(gating)
        info = [f for f in s.findings if f.status == "info"]
        if info:
            ET.SubElement(case, "system-out").text = _finding_lines(info)
    out = [f"lanes: {lane_text(verdict)}"]
    applied = rules_applied_lines(verdict)
    if applied:
        out += ["tolerance rules that changed the verdict:", *applied]
    if verdict.divergences:
        out += ["first divergence (execution order):", _cause_lines(verdict)]
    if applied or verdict.divergences:
        ET.SubElement(suite, "system-out").text = "\n".join(out)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
