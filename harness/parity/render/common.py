"""What the human renderers share: full values, windows into long lists, locations, causes.

Values are never cut: a renderer wraps them. A long list (more than ``WINDOW_ITEMS``
items) is shown as a window around its first element that differs from the other
side, that element marked; ``segments`` returns the pieces and a renderer marks them
its own way (terminal ``>>x<<``, Markdown bold, HTML ``<mark>``).
"""

from __future__ import annotations

import html
import json
from typing import Any

from harness.parity.findings import Divergence, Finding
from harness.parity.walk import typed_equal

STATUS_WORD = {"fail": "FAIL", "stale": "STALE?", "info": "info"}
VERDICT_WORD = {"parity": "PARITY", "stale": "PROBABLE STALE GOLDEN", "fail": "FAIL"}
WINDOW_ITEMS = 12   # lists longer than this are shown as a window around the differing element
WINDOW_RADIUS = 3

Segments = list[tuple[str, bool]]   # (text, marked)


def escape_html(value: Any) -> str:
    """Escape text for HTML element content and (double-quoted) attribute values."""
    return html.escape(str(value), quote=True)


def text_of(value: Any) -> str:
    """Compact JSON text of a value (a string as itself)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def first_difference(golden: Any, actual: Any) -> int | None:
    """Index of the first element where two lists differ (None: not two lists, or equal)."""
    if not (isinstance(golden, list) and isinstance(actual, list)):
        return None
    for i in range(max(len(golden), len(actual))):
        if i >= len(golden) or i >= len(actual) or not typed_equal(golden[i], actual[i]):
            return i
    return None


def segments(value: Any, other: Any) -> Segments:
    """The value as text pieces: whole, or for a long list a window around the first
    element that differs from ``other`` (marked), with the left-out items counted."""
    at = first_difference(value, other)
    if not isinstance(value, list) or len(value) <= WINDOW_ITEMS or at is None:
        return [(text_of(value), False)]
    lo, hi = max(0, at - WINDOW_RADIUS), min(len(value), at + WINDOW_RADIUS + 1)
    out: Segments = [("[", False)]
    if lo > 0:
        out.append((f"… {lo} item(s) …, ", False))
    for i in range(lo, hi):
        out.append((f"{i}: {text_of(value[i])}", i == at))
        if i + 1 < hi:
            out.append((", ", False))
    if at >= len(value):
        out.append((f"{at}: (none)", True))
    if hi < len(value):
        out.append((f", … {len(value) - hi} item(s) …", False))
    out.append((f"] ({len(value)} items)", False))
    return out


def plain(segs: Segments, mark: tuple[str, str] = (">>", "<<")) -> str:
    return "".join(f"{mark[0]}{t}{mark[1]}" if m else t for t, m in segs)


def value_text(value: Any, other: Any, mark: tuple[str, str] = (">>", "<<")) -> str:
    """Full text of one side's value (a window for long lists), differing element marked."""
    return plain(segments(value, other), mark)


def number_cell(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def coords_cell(coords: dict | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(coords.items())) if coords else ""


def coords_text(f: Finding) -> str:
    """The run's coordinates, and the golden's where they differ."""
    text = coords_cell(f.coords)
    if f.golden_coords:
        text += f" (golden: {coords_cell(f.golden_coords)})"
    return text


def position_text(f: Finding) -> str:
    """Where an ordered-list finding sits: index on each side, neighbours, changed fields."""
    pos = f.position
    if not pos:
        return ""
    around = []
    if pos.get("before") is not None:
        around.append(f"after {text_of(pos['before'])}")
    if pos.get("after") is not None:
        around.append(f"before {text_of(pos['after'])}")
    where = "; ".join(around)
    if f.kind == "added":
        head = f"inserted at run position {pos['actual']} (golden position {pos.get('golden_at')})"
    elif f.kind == "removed":
        head = f"missing from the run: golden position {pos['golden']} (run position {pos.get('run_at')})"
    else:
        fields = ", ".join(f.fields) if f.fields else "element"
        head = f"{fields} changed at golden position {pos['golden']} (run position {pos['actual']})"
        changes = _field_changes(f)
        if changes:
            head += f": {changes}"
    return f"{head}{'; ' + where if where else ''}"


def _field_changes(f: Finding) -> str:
    g, a = f.golden, f.actual
    if not (isinstance(g, list) and isinstance(a, list)) or not f.fields:
        return ""
    names = {"op": 0, "group": 1, "dtype": 2, "numel": 3}
    parts = []
    for name in f.fields:
        i = names.get(name, int(name) if str(name).isdecimal() else None)
        if i is not None and i < len(g) and i < len(a):
            parts.append(f"{name} {text_of(g[i])} -> {text_of(a[i])}")
    return ", ".join(parts)


def location(f: Finding) -> str:
    """surface section [coords] phase key: kind."""
    parts = [f.surface, f.section or "(surface)"]
    coords = coords_text(f)
    if coords:
        parts.append(f"[{coords}]")
    if f.phase and f.phase != f.section:
        parts.append(f.phase)
    parts.append(f.key or "/")
    return " ".join(parts) + f": {f.kind}"


def consequences_text(d: Divergence) -> str:
    if not d.consequences:
        return "no consequences"
    per_surface = ", ".join(f"{n} {s}" for s, n in d.counts().items())
    rules = ", ".join(f"{r} {n}" for r, n in d.rule_counts().items())
    return f"+ {len(d.consequences)} consequence(s): {per_surface} (rules: {rules})"


def finding_row(f: Finding, mark: tuple[str, str] = (">>", "<<")) -> list[str]:
    """STATUS SECTION COORDS PHASE KEY KIND LANE GOLDEN ACTUAL ABS REL (full values)."""
    return [STATUS_WORD[f.status], f.section or "(surface)", coords_text(f), f.phase or "", f.key or "/",
            f.kind, f.lane, value_text(f.golden, f.actual, mark), value_text(f.actual, f.golden, mark),
            number_cell(f.abs_err), number_cell(f.rel_err)]


HEADER = ["status", "section", "coords", "phase/step", "key", "kind", "lane", "golden", "actual", "abs err", "rel err"]


def _rule_name(rule: str) -> str:
    """A rule's short name for the header: ``tolerances.yaml#/rules/0`` (no directories)."""
    head, sep, pointer = rule.partition("#")
    return f"{head.rsplit('/', 1)[-1]}{sep}{pointer}" if sep else rule


def lane_text(verdict) -> str:
    """Which lane gated, truthfully: the platform mode, what set it, and the rules whose
    tolerance lane passed gated values on a deterministic platform."""
    if not verdict.deterministic:
        why = f"; set by {_rule_name(verdict.lane_source)}" if verdict.lane_source else ""
        return f"nondeterministic platform (tolerance lane gates{why})"
    passed = [r for r in verdict.rules_applied() if r["passed"]]
    if not passed:
        return "deterministic platform (exact lane gates)"
    count = sum(r["passed"] for r in passed)
    names = ", ".join(_rule_name(r["rule"]) for r in passed[:3]) + (", ..." if len(passed) > 3 else "")
    return (f"deterministic platform (exact lane gates, except {count} gated value(s) the tolerance lane "
            f"passed: {names})")


def rules_applied_lines(verdict) -> list[str]:
    """One block per tolerance rule that changed a verdict: the rule (file and pointer, or
    the surface default), its band, what it did, and the findings it absorbed (the first
    few, with both values). ``[]`` when no rule changed anything."""
    out = []
    for r in verdict.rules_applied():
        band = r["band"]
        did = []
        if r["passed"]:
            did.append(f"passed {r['passed']} gated difference(s)")
        if r["stale"]:
            did.append(f"made {r['stale']} a probable stale golden")
        out.append(f"{r['rule']}: surface {r['surface']}, abs {band['abs']}, rel {band['rel']}, when "
                   f"{band['when']} ({band['reason']}): {', '.join(did)}")
        for f in r["examples"]:
            out.append(f"  absorbed {location(f)}: golden {value_text(f.golden, f.actual)} -> actual "
                       f"{value_text(f.actual, f.golden)}")
        if r["passed"] > len(r["examples"]):
            out.append(f"  ... and {r['passed'] - len(r['examples'])} more absorbed (--format json lists the first "
                       "ones per surface)")
    return out


def summary_line(verdict) -> str:
    c = verdict.counts()
    lanes = lane_text(verdict)
    causes = f"; {len(verdict.divergences)} cause(s) first diverging" if verdict.divergences else ""
    spec = getattr(verdict, "spec", None)
    first = (f"the workload spec differs from the golden's ({len(spec.changes) or 'digest only'}"
             f"{' field(s)' if spec.changes else ''}{'' if spec.gating else ', not gated'}), then "
             if spec is not None else "")
    return (f"{VERDICT_WORD[verdict.status]}: {first}{c['fail']} failing, {c['stale']} stale-golden, "
            f"{c['info']} informational finding(s){causes}; {lanes}")
