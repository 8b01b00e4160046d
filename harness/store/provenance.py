"""PROVENANCE.json: why a golden is what it is.

Fields (all required): ``commit`` (git sha of the harness that captured it, or
null), ``date`` (ISO 8601 with time zone), ``reason`` (non-empty: why it was
captured or refreshed), ``command`` (the command line that produced it),
``environment`` (object: versions, platform, device), ``tolerance_evidence``
(null, or an object recording how the tolerances beside it were derived: runs
observed, max drift per metric).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

__all__ = ["PROVENANCE_FIELDS", "new_provenance", "provenance_errors"]

PROVENANCE_FIELDS = ("commit", "date", "reason", "command", "environment", "tolerance_evidence")


def new_provenance(*, commit: str | None, reason: str, command: str, environment: dict,
                   tolerance_evidence: dict | None = None, date: str | None = None) -> dict:
    """A provenance dict; ``date`` defaults to now in UTC."""
    date = date or _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
    return {"commit": commit, "date": date, "reason": reason, "command": command,
            "environment": dict(environment), "tolerance_evidence": tolerance_evidence}


def provenance_errors(doc: Any) -> list[str]:
    """Problems of a provenance document, each naming the field; ``[]`` when valid."""
    if not isinstance(doc, dict):
        return ["provenance must be a JSON object"]
    errors = [f"{name}: required field is missing" for name in PROVENANCE_FIELDS if name not in doc]
    errors += [f"{name}: unexpected field" for name in sorted(set(doc) - set(PROVENANCE_FIELDS))]
    if "commit" in doc and doc["commit"] is not None and not (isinstance(doc["commit"], str) and doc["commit"]):
        errors.append("commit: must be a non-empty string or null")
    if "reason" in doc and not (isinstance(doc["reason"], str) and doc["reason"].strip()):
        errors.append("reason: must be a non-empty string")
    if "command" in doc and not isinstance(doc["command"], str):
        errors.append("command: must be a string")
    if "environment" in doc and not isinstance(doc["environment"], dict):
        errors.append("environment: must be an object")
    if "tolerance_evidence" in doc and not (
        doc["tolerance_evidence"] is None or isinstance(doc["tolerance_evidence"], dict)
    ):
        errors.append("tolerance_evidence: must be an object or null")
    if "date" in doc:
        try:
            parsed = _dt.datetime.fromisoformat(doc["date"]) if isinstance(doc["date"], str) else None
        except ValueError:
            parsed = None
        if parsed is None or parsed.tzinfo is None:
            errors.append(f"date: must be an ISO 8601 timestamp with a time zone, got {doc['date']!r}")
    return errors
