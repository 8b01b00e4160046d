"""JSON verdict: the complete, machine-readable result (every finding, no cap)."""

from __future__ import annotations

import json

from harness.parity.findings import Verdict
from harness.parity.render.bounded import bounded_document, bounded_step_times, bounded_verdict
from harness.parity.render.common import lane_text
from harness.parity.render.provenance import provenance_json
from harness.parity.step_times import StepTimes


def render_json(verdict: Verdict, *, title: str = "golden parity", provenance: dict | None = None,
                step_times: StepTimes | None = None) -> str:
    """``golden_provenance`` (``harness.store.provenance.describe``) and ``step_times``
    (informational: golden beside run per step and phase) are added when given."""
    verdict, provenance = bounded_verdict(verdict), bounded_document(provenance)  # issue 41: bounded output
    step_times = bounded_step_times(step_times)
    extra = {"step_times": step_times.to_dict()} if step_times is not None else {}
    head = {"title": title, "lane_text": lane_text(verdict)}
    return json.dumps({**head, **verdict.to_dict(), **provenance_json(provenance), **extra}, indent=2,
                      sort_keys=True, default=str, allow_nan=False) + "\n"
