"""The provenance block of the HTML report: the golden's provenance, its other recorded fields, the run.

``provenance_block(provenance, run)`` puts, near the top of the page: the golden's
provenance as ``harness.parity.render.provenance.provenance_html`` describes it (repository,
date, reason, versions), then every other top-level field the golden's PROVENANCE.json
holds (the harness commit, the command, fields added later) and the run's fields
(``run_id``), in key order, nested values as compact JSON. Fields added to the store's
provenance therefore show up without a change here. Everything is escaped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from harness.parity.render.common import escape_html as _e
from harness.parity.render.provenance import provenance_html

__all__ = ["provenance_block"]

# shown by provenance_html (describe) already; "environment" is what older goldens' versions came from
_DESCRIBED = frozenset({"repository", "date", "reason", "versions", "environment",
                        "spec"})  # spec: long; a report shows its differences first (Verdict.spec)
_FIRST = ("commit", "command")


def _text(value: Any) -> str:
    if value is None:
        return "(none)"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


# why a field is null, where null is expected rather than a gap
_NONE_BECAUSE = {
    "commit": ("(none: the harness that stored this golden did not run from a git checkout, e.g. an installed "
               "wheel; the repository that holds the golden is recorded under repository)"),
}


def _rows(fields: Mapping[str, Any]) -> str:
    keys = [k for k in _FIRST if k in fields] + sorted(str(k) for k in fields if k not in _FIRST)
    return "".join(f'<dt>{_e(k)}</dt><dd data-field="{_e(k)}">'
                   f'{_e(_NONE_BECAUSE.get(k, "(none)") if fields[k] is None else _text(fields[k]))}</dd>'
                   for k in keys)


def provenance_block(provenance: Mapping[str, Any] | None, run: Mapping[str, Any] | None = None) -> str:
    """HTML of the golden's provenance and the run's fields; empty string when neither is given."""
    out = provenance_html(dict(provenance)) if provenance is not None else []
    other = {k: v for k, v in (provenance or {}).items() if k not in _DESCRIBED}
    if other or run:
        out.append('<section id="run-provenance"><div class="prov-cols">')
        if other:
            out.append(f'<div><h3>golden, as recorded</h3><dl class="prov">{_rows(other)}</dl></div>')
        if run:
            out.append(f'<div><h3>run</h3><dl class="prov">{_rows(run)}</dl></div>')
        out.append("</div></section>")
    return "".join(out)
