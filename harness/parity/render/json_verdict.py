"""JSON verdict: the complete, machine-readable result (every finding, no cap)."""

from __future__ import annotations

import json

from harness.parity.findings import Verdict


def render_json(verdict: Verdict, *, title: str = "golden parity") -> str:
    return json.dumps({"title": title, **verdict.to_dict()}, indent=2, sort_keys=True, default=str,
                      allow_nan=False) + "\n"
