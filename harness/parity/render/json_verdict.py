"""JSON verdict: the complete, machine-readable result (every finding, no cap)."""

from __future__ import annotations

import json

from harness.parity.findings import Verdict
from harness.parity.render.provenance import provenance_json


def render_json(verdict: Verdict, *, title: str = "golden parity", provenance: dict | None = None) -> str:
    """``golden_provenance`` (``harness.store.provenance.describe``) is added when given."""
    return json.dumps({"title": title, **verdict.to_dict(), **provenance_json(provenance)}, indent=2,
                      sort_keys=True, default=str, allow_nan=False) + "\n"
