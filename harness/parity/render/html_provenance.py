"""The provenance block of the HTML report: whatever the golden's provenance holds, plus the run's id.

``provenance_html(provenance, run)`` renders every field it is given (known ones first:
commit, date, reason, command; then the rest in key order; nested values as compact
JSON), so fields added to the store's provenance show up without a change here.
Everything is escaped; no field is required.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["provenance_html"]

_FIRST = ("commit", "date", "reason", "command")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _text(value: Any) -> str:
    if value is None:
        return "(none)"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _rows(fields: Mapping[str, Any]) -> list[str]:
    keys = [k for k in _FIRST if k in fields] + sorted(str(k) for k in fields if k not in _FIRST)
    return [f'<dt>{_e(k)}</dt><dd data-field="{_e(k)}">{_e(_text(fields[k]))}</dd>' for k in keys]


def provenance_html(provenance: Mapping[str, Any] | None, run: Mapping[str, Any] | None = None) -> str:
    """A ``<section id="provenance">`` with the golden's provenance and the run's fields
    (e.g. ``run_id``); empty string when neither is given."""
    if not provenance and not run:
        return ""
    out = ['<section id="provenance" class="provenance"><h2>Provenance</h2><div class="prov-cols">']
    if provenance:
        out.append('<div><h3>golden</h3><dl class="prov" id="provenance-golden">' + "".join(_rows(provenance))
                   + "</dl></div>")
    if run:
        out.append('<div><h3>run</h3><dl class="prov" id="provenance-run">' + "".join(_rows(run)) + "</dl></div>")
    out.append("</div></section>")
    return "".join(out)
