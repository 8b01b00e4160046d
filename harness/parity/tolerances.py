"""Tolerance tables: surface defaults plus a golden's ``tolerances.yaml``.

``tolerances.yaml`` (optional, in ``goldens/<workload>/<platform>/``)::

    version: 1
    deterministic: false          # optional: this platform is not bitwise reproducible
    rules:
      - surface: training         # a registered surface name
        key: "metrics.loss"       # fnmatch glob over the dotted key path in a section
        section: "step*"          # optional fnmatch glob over section ids (default "*")
        abs: 0.0                  # optional, >= 0 (default 0)
        rel: 1.0e-5               # optional, >= 0 (default 0)
        when: nondeterministic    # optional: always | nondeterministic (default)
        reason: "why this band"   # required, non-empty
        evidence: {...}           # optional free-form (runs observed, max drift seen)

Rules from the file are consulted before the surface defaults; the first rule that
matches wins. Errors name the file and the field (``rules[2].reason``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.surfaces.registry import SURFACES, ToleranceRule

__all__ = ["ToleranceTable", "TolerancesFile", "ToleranceFileError", "load_tolerances", "parse_tolerances",
           "parse_tolerances_bytes"]

_RULE_FIELDS = {"surface", "key", "section", "abs", "rel", "when", "reason", "evidence"}


class ToleranceFileError(ValueError):
    """A malformed tolerances.yaml; the message names the file and the field."""


@dataclass(frozen=True)
class TolerancesFile:
    rules: tuple[ToleranceRule, ...]
    deterministic: bool | None = None


class ToleranceTable:
    """Ordered rules: overrides first, then every surface's defaults."""

    def __init__(self, overrides: Iterable[ToleranceRule] = (), *, include_defaults: bool = True):
        rules = list(overrides)
        if include_defaults:
            for spec in SURFACES.values():
                rules.extend(spec.tolerances)
        self.rules: tuple[ToleranceRule, ...] = tuple(rules)
        self._by_surface: dict[str, tuple[ToleranceRule, ...]] = {}
        for rule in self.rules:
            self._by_surface[rule.surface] = self._by_surface.get(rule.surface, ()) + (rule,)

    def lookup(self, surface: str, section: str, key: str) -> ToleranceRule | None:
        """The first rule matching (surface, section id, dotted key path), or None (exact lane)."""
        for rule in self._by_surface.get(surface, ()):
            if rule.matches(surface, section, key):
                return rule
        return None

    @classmethod
    def coerce(cls, value: ToleranceTable | Sequence[ToleranceRule] | None) -> ToleranceTable:
        if isinstance(value, ToleranceTable):
            return value
        return cls(value or ())


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToleranceFileError(f"{where}: must be a number, got {value!r}")
    return float(value)


def parse_tolerances(doc: Any, *, source: str = "tolerances.yaml") -> TolerancesFile:
    """Validate a parsed tolerances document; raise ToleranceFileError naming the field."""
    if doc is None:  # an empty (or truncated) file: refused, so that a lost file is never read as "no rules"
        raise ToleranceFileError(f"{source}: empty document (a tolerances.yaml holds at least 'version: 1'; "
                                 "delete the file for no overrides)")
    if not isinstance(doc, dict):
        raise ToleranceFileError(f"{source}: top level must be a mapping")
    unknown = set(doc) - {"version", "deterministic", "rules"}
    if unknown:
        raise ToleranceFileError(f"{source}: unknown field(s) {', '.join(sorted(unknown))}")
    version = doc.get("version", 1)
    if type(version) is not int or version != 1:  # `true` == 1 and 1.0 == 1 in Python: refused too
        raise ToleranceFileError(f"{source}: version: {version!r} is not supported (supported: 1)")
    deterministic = doc.get("deterministic")
    if deterministic is not None and not isinstance(deterministic, bool):
        raise ToleranceFileError(f"{source}: deterministic: must be true or false")
    raw_rules = doc.get("rules")
    raw_rules = [] if raw_rules is None else raw_rules
    if not isinstance(raw_rules, list):
        raise ToleranceFileError(f"{source}: rules: must be a list")
    rules = []
    for index, raw in enumerate(raw_rules):
        where = f"{source}: rules[{index}]"
        if not isinstance(raw, dict):
            raise ToleranceFileError(f"{where}: must be a mapping")
        extra = set(raw) - _RULE_FIELDS
        if extra:
            raise ToleranceFileError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
        for required in ("surface", "key", "reason"):
            if not isinstance(raw.get(required), str) or not raw[required].strip():
                raise ToleranceFileError(f"{where}.{required}: required, a non-empty string")
        if raw["surface"] not in SURFACES:
            raise ToleranceFileError(
                f"{where}.surface: unknown surface {raw['surface']!r}; known: {', '.join(SURFACES)}"
            )
        when = raw.get("when", "nondeterministic")
        if when not in ("always", "nondeterministic"):
            raise ToleranceFileError(f"{where}.when: must be 'always' or 'nondeterministic', got {when!r}")
        bounds = {}
        for name in ("abs", "rel"):
            value = _number(raw.get(name, 0.0), f"{where}.{name}")
            if not (0.0 <= value < float("inf")):
                raise ToleranceFileError(f"{where}.{name}: must be finite and >= 0, got {value!r}")
            bounds[name] = value
        section = raw.get("section", "*")
        if not isinstance(section, str):
            raise ToleranceFileError(f"{where}.section: must be a string glob")
        rules.append(ToleranceRule(surface=raw["surface"], key=raw["key"], reason=raw["reason"],
                                   section=section, when=when, **bounds))
    return TolerancesFile(tuple(rules), deterministic)


def parse_tolerances_bytes(data: bytes, *, source: str = "tolerances.yaml") -> TolerancesFile:
    """``parse_tolerances`` of a file's bytes, read with the specs' strict, bounded YAML
    parser (the size limit of ``load_tolerances``, UTF-8 only, alias-expansion limit,
    duplicate keys refused)."""
    from harness.spec import yaml_io
    from harness.spec.errors import SpecError

    if len(data) > yaml_io.MAX_YAML_BYTES:
        raise ToleranceFileError(f"{source}: {len(data)} bytes is more than the {yaml_io.MAX_YAML_BYTES}-byte "
                                 "limit for a YAML file (GOLDEN_YAML_MAX_BYTES)")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToleranceFileError(f"{source}: not UTF-8 (byte {exc.start})") from None
    try:
        doc = yaml_io.load_yaml_text(text, source=source)
    except SpecError as exc:
        raise ToleranceFileError(f"not valid YAML: {exc}") from None
    return parse_tolerances(doc, source=source)


def load_tolerances(path: str | Path) -> TolerancesFile:
    """Read and validate a tolerances.yaml with the specs' strict, bounded
    YAML reader (size and alias-expansion limits, duplicate keys refused)."""
    from harness.spec.errors import SpecError
    from harness.spec.yaml_io import load_yaml_file

    path = Path(path)
    try:
        doc = load_yaml_file(path)
    except SpecError as exc:
        raise ToleranceFileError(f"not valid YAML: {exc}") from None
    return parse_tolerances(doc, source=str(path))
