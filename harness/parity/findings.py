"""Findings and verdicts: what the parity comparison reports.

Statuses
--------
* ``fail``: a gated value differs and no lane lets it pass.
* ``stale``: deterministic platform, the exact lane fails but the value is inside
  its declared tolerance band: the signature of golden drift after a toolchain
  change (probable stale golden). Reported, never silent; it still fails the gate.
* ``info``: an informational surface (memory, timings) left its band. Shown, but
  does not fail the gate.

A verdict's status is ``fail`` if any finding fails, else ``stale`` if any is
stale, else ``parity``. Findings are sorted (surface, section, key path; numbers in
a path compare as numbers, so ``/collectives/2`` comes before ``/collectives/10``),
so verdicts are deterministic for equal inputs. ``Verdict.divergences`` orders the
gated findings by where the runs first diverge and groups the ones that follow
from an earlier one under it (``harness.parity.divergence``; docs/gate.md).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["Finding", "SurfaceResult", "Verdict", "Divergence", "Kind", "Lane", "Status", "natural_key", "path_key"]

Kind = Literal["changed", "added", "removed", "type"]
Lane = Literal["exact", "tolerance"]
Status = Literal["fail", "stale", "info"]

_MISSING = "<absent>"
TOLERATED_EXAMPLES = 5   # gated differences a tolerance rule passed, kept per rule and surface as examples
_DIGITS = re.compile(r"(\d+)")


@dataclass(frozen=True)
class Finding:
    """One difference between a golden and an actual surface.

    ``section`` is None for a whole-surface finding; ``key`` is the JSON pointer of
    the value inside the section after the phase prefix (``""`` for a whole section);
    ``path`` is the full path inside the section. ``golden``/``actual`` are the
    values (``"<absent>"`` on the side where the value does not exist). ``abs_err``
    and ``rel_err`` (relative to golden) are set for numeric pairs; ``rel_err`` is
    None when golden is 0. ``lane`` is the lane whose result decided; ``tolerance``
    describes the band consulted (if any) and whether the pair was inside it.
    ``coords`` are the run's coordinates of the section (the golden's when the run has
    none) and ``golden_coords`` the golden's where they differ from the run's.
    Findings of an ordered list (``harness.parity.walk.SEQUENCES``) carry ``position``:
    ``golden`` / ``actual`` index of the element (None on the side without it) and its
    ``before`` / ``after`` neighbours; a changed element names the ``fields`` that differ.
    """

    surface: str
    section: str | None
    kind: Kind
    lane: Lane
    status: Status
    key: str = ""
    path: tuple = ()
    coords: dict | None = None
    phase: str | None = None
    golden: Any = _MISSING
    actual: Any = _MISSING
    abs_err: float | None = None
    rel_err: float | None = None
    tolerance: dict | None = None
    note: str = ""
    golden_coords: dict | None = None
    position: dict | None = None
    fields: tuple = ()

    def sort_key(self) -> tuple:
        return (self.surface, natural_key(self.section or ""), path_key(self.path), self.kind)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["path"] = list(self.path)
        out["fields"] = list(self.fields)
        return out


def natural_key(text: str) -> tuple:
    """Sort key of a string with its digit runs compared as numbers (``rank2`` < ``rank10``)."""
    return tuple((0, int(part), "") if part.isdecimal() else (1, 0, part) for part in _DIGITS.split(text) if part)


def path_key(path: tuple) -> tuple:
    """Sort key of a path: integers as numbers, strings naturally; mixed parts never compare raw."""
    return tuple((0, (p,)) if isinstance(p, int) and not isinstance(p, bool) else (1, natural_key(str(p)))
                 for p in path)


@dataclass
class SurfaceResult:
    """Per-surface summary: how many sections were compared and which differed."""

    name: str
    gated: bool
    sections_compared: int = 0
    sections_differing: int = 0
    findings: list[Finding] = field(default_factory=list)
    # gated differences a tolerance rule passed (not failures): the first TOLERATED_EXAMPLES per
    # rule, and how many each rule passed in all (``tolerated_counts``, rule source -> count)
    tolerated: list[Finding] = field(default_factory=list)
    tolerated_counts: dict[str, int] = field(default_factory=dict)

    def note_tolerated(self, finding: Finding) -> None:
        """Record a gated difference a tolerance rule passed (bounded examples, every one counted)."""
        rule = (finding.tolerance or {}).get("rule", "")
        seen = self.tolerated_counts.get(rule, 0)
        self.tolerated_counts[rule] = seen + 1
        if seen < TOLERATED_EXAMPLES:
            self.tolerated.append(finding)

    @property
    def status(self) -> str:
        statuses = {f.status for f in self.findings}
        if "fail" in statuses:
            return "fail"
        if "stale" in statuses:
            return "stale"
        return "parity"

    def to_dict(self) -> dict:
        return {"name": self.name, "gated": self.gated, "status": self.status,
                "sections_compared": self.sections_compared, "sections_differing": self.sections_differing,
                "findings": [f.to_dict() for f in self.findings],
                "tolerated": [f.to_dict() for f in self.tolerated], "tolerated_counts": dict(self.tolerated_counts)}


@dataclass
class Verdict:
    """The result of ``compare``: one SurfaceResult per surface seen on either side."""

    deterministic: bool
    surfaces: dict[str, SurfaceResult]
    divergences: list[Divergence] = field(default_factory=list)
    # harness.parity.spec_check.SpecDifference: the run's workload spec is not the golden's. The
    # first finding every renderer shows (before the surfaces); fails the verdict when it gates.
    spec: Any = None
    lane_source: str = ""   # what chose the lane mode (tolerances.yaml#/deterministic, --nondeterministic)

    def rules_applied(self) -> list[dict]:
        """Every rule that changed a verdict, in rule order: it passed a gated difference
        (``passed``: how many; ``examples``: the first ones) or made one a probable stale
        golden (``stale``). Each entry: ``rule`` (file#/rules/i or the surface default),
        ``surface``, ``band`` (abs, rel, when, reason), ``passed``, ``stale``, ``examples``."""
        out: dict[str, dict] = {}

        def entry(f: Finding) -> dict:
            band = f.tolerance or {}
            rule = band.get("rule", "")
            return out.setdefault(rule, {"rule": rule, "surface": f.surface, "passed": 0, "stale": 0,
                                         "band": {k: band.get(k) for k in ("abs", "rel", "when", "reason")},
                                         "examples": []})

        for name in sorted(self.surfaces):
            s = self.surfaces[name]
            for f in s.tolerated:
                e = entry(f)
                e["examples"].append(f)
            for rule, count in s.tolerated_counts.items():
                if rule in out:
                    out[rule]["passed"] += count
            for f in s.findings:
                if f.status == "stale":
                    entry(f)["stale"] += 1
        return list(out.values())

    @property
    def findings(self) -> list[Finding]:
        return [f for name in sorted(self.surfaces) for f in self.surfaces[name].findings]

    @property
    def status(self) -> str:
        statuses = {s.status for s in self.surfaces.values()}
        if "fail" in statuses or (self.spec is not None and self.spec.gating):
            return "fail"
        if "stale" in statuses:
            return "stale"
        return "parity"

    @property
    def ok(self) -> bool:
        return self.status == "parity"

    def counts(self) -> dict[str, int]:
        out = {"fail": 0, "stale": 0, "info": 0}
        for f in self.findings:
            out[f.status] += 1
        return out

    def to_dict(self) -> dict:
        rules = [{**r, "examples": [f.to_dict() for f in r["examples"]]} for r in self.rules_applied()]
        return {"status": self.status, "deterministic": self.deterministic, "lane_source": self.lane_source,
                "rules_applied": rules, "counts": self.counts(),
                "spec": self.spec.to_dict() if self.spec is not None else None,
                "first_divergence": [d.to_dict() for d in self.divergences],
                "surfaces": {name: self.surfaces[name].to_dict() for name in sorted(self.surfaces)}}


@dataclass
class Divergence:
    """One cause and the findings that follow from it, in execution order.

    ``point`` is the cause's (step, stage, rank) in execution order; ``consequences``
    are (rule, finding) pairs, the rule naming why the finding follows from the cause
    (``same change``, ``same rank and phase``, ``follows the data``, ``after topology``)."""

    cause: Finding
    point: tuple
    consequences: list[tuple[str, Finding]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Consequences per surface (sorted by surface name)."""
        out: dict[str, int] = {}
        for _, f in self.consequences:
            out[f.surface] = out.get(f.surface, 0) + 1
        return dict(sorted(out.items()))

    def rule_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rule, _ in self.consequences:
            out[rule] = out.get(rule, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict:
        return {"cause": self.cause.to_dict(), "point": list(self.point),
                "consequence_counts": self.counts(), "rule_counts": self.rule_counts(),
                "consequences": [{"rule": rule, "surface": f.surface, "section": f.section, "phase": f.phase,
                                  "key": f.key, "kind": f.kind} for rule, f in self.consequences]}
