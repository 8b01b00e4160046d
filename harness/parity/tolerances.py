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

Trust (issue 41): a tolerances.yaml is part of its golden. The store records its digest
in PROVENANCE.json (``tolerances: {sha256, bytes}``) when it writes the golden, and
every read refuses a file that digest does not cover (``coverage_problems``). Policy
(``policy_problems``, enforced by every read and by ``golden lint``): on a gated surface
a rule wider than ``CEILINGS`` (per surface), a ``when: always`` rule on a deterministic
platform (``deterministic_platform``), and ``deterministic: false`` on a deterministic
platform are errors unless the golden's provenance carries a waiver for it:
``tolerance_evidence: {waivers: {"rules[<i>]" | "deterministic": {reason: TEXT,
evidence: {...non-empty}}}}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.surfaces.registry import SURFACES, ToleranceRule

__all__ = ["CEILINGS", "ToleranceTable", "TolerancesFile", "ToleranceFileError", "coverage_problems",
           "deterministic_platform", "golden_tolerances", "load_tolerances", "parse_tolerances",
           "parse_tolerances_bytes", "policy_problems", "tolerances_record"]

# The widest band a tolerances.yaml rule may declare on a gated surface without a waiver:
# surface -> (abs, rel). Structure and counts (topology, lifecycle, operators, collectives)
# admit no band at all; informational surfaces (memory, timings) never gate and have none.
CEILINGS: dict[str, tuple[float, float]] = {
    "training": (1e-3, 0.05),
    "rollouts": (1e-3, 0.05),
    "topology": (0.0, 0.0),
    "lifecycle": (0.0, 0.0),
    "operators": (0.0, 0.0),
    "collectives": (0.0, 0.0),
}

_RULE_FIELDS = {"surface", "key", "section", "abs", "rel", "when", "reason", "evidence"}


class ToleranceFileError(ValueError):
    """A malformed tolerances.yaml; the message names the file and the field."""


@dataclass(frozen=True)
class TolerancesFile:
    rules: tuple[ToleranceRule, ...]
    deterministic: bool | None = None
    source: str = "tolerances.yaml"

    @property
    def deterministic_origin(self) -> str:
        """Where a ``deterministic: false`` comes from, for the report header."""
        return f"{self.source}#/deterministic"


class ToleranceTable:
    """Ordered rules: overrides first, then every surface's defaults."""

    def __init__(self, overrides: Iterable[ToleranceRule] = (), *, include_defaults: bool = True):
        rules = list(overrides)
        if include_defaults:
            for spec in SURFACES.values():
                rules.extend(spec.tolerances)
        self.rules: tuple[ToleranceRule, ...] = tuple(rules)
        self.lane_source = ""  # what set the lane mode of the verdicts compared with it (the report header)
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
                                   section=section, when=when, origin=f"{source}#/rules/{index}", **bounds))
    return TolerancesFile(tuple(rules), deterministic, source)


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


def golden_tolerances(golden: Any) -> TolerancesFile | None:
    """The tolerances of a golden as ``read_golden`` read them (``Golden.files``: the bytes its
    PROVENANCE.json digest was checked against, never the file read again), None without one."""
    if golden.tolerances_path is None:
        return None
    data = golden.files.get("tolerances.yaml") if golden.files else None
    if data is None:
        return load_tolerances(golden.tolerances_path)
    return parse_tolerances_bytes(bytes(data), source=str(golden.tolerances_path))


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


def deterministic_platform(platform: str) -> bool:
    """True for the platforms whose runs are bitwise reproducible: ``cpu`` and its
    ``cpu-*`` kinds (``cpu-vllm``, ``cpu-cluster``), with or without an ``@<key>``
    numerics variant. ``cuda`` is not."""
    base = str(platform).split("@", 1)[0]
    return base == "cpu" or base.startswith("cpu-")


def tolerances_record(data: bytes) -> dict:
    """What PROVENANCE.json records of a golden's tolerances.yaml: ``{"sha256", "bytes"}``."""
    import hashlib

    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def coverage_problems(path: str, data: bytes | None, provenance: Any) -> list[str]:
    """A tolerances.yaml (``data``; None: the golden has none) the provenance's
    ``tolerances`` digest does not cover, or a digest without its file. ``[]`` when
    they agree (or neither exists: every golden stored before issue 41)."""
    recorded = provenance.get("tolerances") if isinstance(provenance, dict) else None
    if data is None:
        if recorded is not None:
            sha = str(recorded.get("sha256") if isinstance(recorded, dict) else recorded)[:12]
            return [(f"{path}: missing, yet PROVENANCE.json#/tolerances records one (sha256 {sha}); restore it "
                     "or refresh the golden")]
        return []
    if recorded is None:
        return [(f"{path}: not covered by PROVENANCE.json#/tolerances (no digest recorded): a tolerances.yaml "
                 "is part of its golden and is written by golden capture/refresh, never dropped in beside one")]
    if recorded != tolerances_record(data):
        return [(f"{path}: sha256 {tolerances_record(data)['sha256'][:12]} ({len(data)} bytes) does not match "
                 "PROVENANCE.json#/tolerances (the file was changed after the golden was stored; goldens "
                 "change only through golden capture/refresh)")]
    return []


def _waiver_problem(waivers: Any, pointer: str) -> str | None:
    """None when ``waivers[pointer]`` holds a non-empty ``reason`` and ``evidence``."""
    entry = waivers.get(pointer) if isinstance(waivers, dict) else None
    if entry is None:
        return "no waiver"
    if not isinstance(entry, dict) or not (isinstance(entry.get("reason"), str) and entry["reason"].strip()):
        return "its waiver has no reason"
    if not (isinstance(entry.get("evidence"), dict) and entry["evidence"]):
        return "its waiver has no evidence (an object: runs observed, drift measured)"
    return None


def policy_problems(tol: TolerancesFile, *, platform: str, provenance: Any) -> list[str]:
    """What a tolerances.yaml may not declare without a waiver (module docstring):
    a rule on a gated surface wider than ``CEILINGS``, a ``when: always`` rule on a
    gated surface of a deterministic platform, ``deterministic: false`` on a
    deterministic platform. Each problem names the file, the rule's pointer and the
    waiver that would admit it."""
    evidence = provenance.get("tolerance_evidence") if isinstance(provenance, dict) else None
    waivers = evidence.get("waivers") if isinstance(evidence, dict) else None
    where = "PROVENANCE.json#/tolerance_evidence/waivers"
    out = []
    fixed = deterministic_platform(platform)
    if tol.deterministic is False and fixed:
        problem = _waiver_problem(waivers, "deterministic")
        if problem:
            out.append(f"{tol.source}#/deterministic: false on the deterministic platform {platform!r} ({problem} "
                       f"at {where}/deterministic): the exact lane would stop gating")
    for index, rule in enumerate(tol.rules):
        if rule.surface not in CEILINGS:
            continue  # informational: never gates
        ceiling_abs, ceiling_rel = CEILINGS[rule.surface]
        wide = rule.abs > ceiling_abs or rule.rel > ceiling_rel
        always = rule.when == "always" and fixed
        if not (wide or always):
            continue
        problem = _waiver_problem(waivers, f"rules[{index}]")
        if problem is None:
            continue
        what = []
        if wide:
            what.append(f"abs {rule.abs:g}, rel {rule.rel:g} is wider than the ceiling of surface {rule.surface} "
                        f"(abs {ceiling_abs:g}, rel {ceiling_rel:g})")
        if always:
            what.append(f"when: always on a gated surface of the deterministic platform {platform!r}")
        out.append(f"{tol.source}#/rules/{index}: {'; '.join(what)} ({problem} at {where}/rules[{index}])")
    return out
