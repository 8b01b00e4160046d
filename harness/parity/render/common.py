"""Cell formatting shared by the human renderers."""

from __future__ import annotations

import json
from typing import Any

from harness.parity.findings import Finding

STATUS_WORD = {"fail": "FAIL", "stale": "STALE?", "info": "info"}
VERDICT_WORD = {"parity": "PARITY", "stale": "PROBABLE STALE GOLDEN", "fail": "FAIL"}


def value_cell(value: Any, width: int = 40) -> str:
    """Compact JSON-ish text of a value, cut to ``width`` characters with an ellipsis."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def number_cell(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def coords_cell(coords: dict | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(coords.items())) if coords else ""


def finding_row(f: Finding) -> list[str]:
    """STATUS SECTION COORDS PHASE KEY KIND LANE GOLDEN ACTUAL ABS REL."""
    return [STATUS_WORD[f.status], f.section or "(surface)", coords_cell(f.coords), f.phase or "", f.key or "/",
            f.kind, f.lane, value_cell(f.golden), value_cell(f.actual), number_cell(f.abs_err), number_cell(f.rel_err)]


HEADER = ["status", "section", "coords", "phase/step", "key", "kind", "lane", "golden", "actual", "abs err", "rel err"]


def summary_line(verdict) -> str:
    c = verdict.counts()
    lanes = (
        "deterministic platform (exact lane gates)"
        if verdict.deterministic
        else "nondeterministic platform (tolerance lane gates)"
    )
    return (f"{VERDICT_WORD[verdict.status]}: {c['fail']} failing, {c['stale']} stale-golden, "
            f"{c['info']} informational finding(s); {lanes}")
