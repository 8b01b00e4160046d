"""What every report shows of a verdict: bounded text, unambiguous names (issue 41).

Contract
--------
``bounded_verdict(verdict)`` returns a copy of the verdict for rendering in which

* every string a finding carries (a value or a string inside one, a dict key inside a
  value, the key pointer, section id, phase, path parts, position neighbours, changed
  fields, note, the tolerance's reason) is at most ``VALUE_CHARS`` characters
  (``KEY_CHARS`` for a key, section id, phase, path part or dict key); a longer one is
  cut to ``<prefix>…[cut: N chars, M bytes, sha256 <16 hex>]`` within that length, so
  the cut text names the size and digest of the whole and two different long strings
  stay different;
* a value whose JSON text is still longer than ``VALUE_JSON_CHARS`` after that (a
  list of a million numbers) becomes the cut form of its JSON text;
* a key pointer, section id or phase that prints the same as another one of the
  verdict while being a different string (NFC and NFD spellings of a name, or strings
  that differ only in invisible characters) is shown escaped (``\\u0301``), so each
  is told apart on screen.

The verdict's statuses, counts and grouping are unchanged: this is only what renders.
``render`` applies it to every format (terminal, Markdown, JSON, JUnit, HTML), so a
report's size is bounded by the number of findings shown, whatever the documents hold
(a 120 MiB string value renders in well under a second). It is idempotent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import unicodedata
from functools import lru_cache
from typing import Any

from harness.parity.findings import Divergence, Finding, Verdict

__all__ = ["KEY_CHARS", "VALUE_CHARS", "VALUE_JSON_CHARS", "bounded_document", "bounded_step_times", "bounded_value",
           "bounded_verdict", "cut"]

VALUE_CHARS = 2000        # a string value (or a string inside one) longer than this is cut
KEY_CHARS = 300           # a key pointer, section id, phase, path part or dict key longer than this is cut
VALUE_JSON_CHARS = 16000  # a value whose (bounded) JSON text is longer than this is shown as cut JSON text
_CUT = "…[cut: "


@lru_cache(maxsize=256)
def _digest(text: str) -> tuple[int, str]:
    data = text.encode("utf-8", "surrogatepass")
    return len(data), hashlib.sha256(data).hexdigest()[:16]


def cut(text: str, limit: int = VALUE_CHARS) -> str:
    """``text`` itself when at most ``limit`` characters, else a prefix and a marker with the
    whole's size and digest, ``limit`` characters in all (at least the marker)."""
    if len(text) <= limit:
        return text
    size, digest = _digest(text)
    marker = f"{_CUT}{len(text)} chars, {size} bytes, sha256 {digest}]"
    return text[:max(0, limit - len(marker))] + marker


def _bound_value(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return cut(value)
    if isinstance(value, dict):
        return {cut(str(k), KEY_CHARS): _bound_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_bound_value(v, depth + 1) for v in value]
    return value


def _needs_bounding(value: Any) -> bool:
    """False for what is certainly short already (numbers, booleans, short strings)."""
    if isinstance(value, str):
        return len(value) > min(VALUE_CHARS, KEY_CHARS)
    return isinstance(value, (dict, list, tuple))


def bounded_value(value: Any) -> Any:
    """A value as reports show it (module contract)."""
    if not _needs_bounding(value):
        return value
    out = _bound_value(value)
    if isinstance(out, (dict, list)):
        text = json.dumps(out, sort_keys=True, default=str)
        if len(text) > VALUE_JSON_CHARS:
            return cut(text, VALUE_JSON_CHARS)
    return out


def _escaped(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode("ascii")


def _shown(text: str) -> str:
    """How a name looks on screen: NFC, without format characters (zero-width, bidi)."""
    return "".join(c for c in unicodedata.normalize("NFC", text) if unicodedata.category(c) != "Cf")


def _ambiguous(findings: list[Finding]) -> set[str]:
    """Names (keys, sections, phases) that print like another, different name of the verdict."""
    groups: dict[str, set[str]] = {}
    for f in findings:
        for name in (f.key, f.section, f.phase):
            if isinstance(name, str) and not name.isascii():
                groups.setdefault(_shown(name), set()).add(name)
    for f in findings:  # an ASCII name can be the look-alike of a non-ASCII one
        for name in (f.key, f.section, f.phase):
            if isinstance(name, str) and name.isascii() and name in groups:
                groups[name].add(name)
    return {name for names in groups.values() if len(names) > 1 for name in names}


def _name(text: str | None, ambiguous: set[str]) -> str | None:
    if text is None:
        return None
    return cut(_escaped(text) if text in ambiguous else text, KEY_CHARS)


def _bound_finding(f: Finding, ambiguous: set[str]) -> Finding:
    position = f.position
    if position:
        position = {k: bounded_value(v) for k, v in position.items()}
    tolerance = f.tolerance
    if tolerance:
        tolerance = {k: (cut(v) if isinstance(v, str) else v) for k, v in tolerance.items()}
    return dataclasses.replace(
        f, golden=bounded_value(f.golden), actual=bounded_value(f.actual), key=_name(f.key, ambiguous) or "",
        section=_name(f.section, ambiguous), phase=_name(f.phase, ambiguous),
        path=tuple(cut(p, KEY_CHARS) if isinstance(p, str) else p for p in f.path), position=position,
        fields=tuple(cut(str(x), KEY_CHARS) for x in f.fields), note=cut(f.note), tolerance=tolerance)


def bounded_verdict(verdict: Verdict) -> Verdict:
    """The verdict as every report shows it (module contract); the same object identity
    mapping is kept between a surface's findings and the divergences that name them."""
    everything = [f for s in verdict.surfaces.values() for f in (*s.findings, *s.tolerated)]
    ambiguous = _ambiguous(everything)
    mapped: dict[int, Finding] = {}

    def bound(f: Finding) -> Finding:
        if id(f) not in mapped:
            mapped[id(f)] = _bound_finding(f, ambiguous)
        return mapped[id(f)]

    surfaces = {name: dataclasses.replace(s, findings=[bound(f) for f in s.findings],
                                          tolerated=[bound(f) for f in s.tolerated],
                                          tolerated_counts={cut(k, VALUE_CHARS): v
                                                            for k, v in s.tolerated_counts.items()})
                for name, s in verdict.surfaces.items()}
    divergences = [Divergence(cause=bound(d.cause), point=d.point,
                              consequences=[(rule, bound(f)) for rule, f in d.consequences])
                   for d in verdict.divergences]
    return dataclasses.replace(verdict, surfaces=surfaces, divergences=divergences,
                               lane_source=cut(verdict.lane_source, VALUE_CHARS))


def bounded_step_times(times: Any) -> Any:
    """Step times (``harness.parity.step_times.StepTimes``) with every phase name cut as a key."""
    if times is None or all(len(p) <= KEY_CHARS for p in times.phases):
        return times
    name = {p: cut(p, KEY_CHARS) for p in times.phases}
    return dataclasses.replace(times, phases=tuple(name[p] for p in times.phases),
                               golden={(name.get(p, cut(p, KEY_CHARS)), s): v for (p, s), v in times.golden.items()},
                               actual={(name.get(p, cut(p, KEY_CHARS)), s): v for (p, s), v in times.actual.items()})


def bounded_document(doc: Any) -> Any:
    """A document shown beside the verdict (the golden's provenance): every string and key
    cut as a value's are, its structure kept."""
    return _bound_value(doc) if _needs_bounding(doc) else doc
