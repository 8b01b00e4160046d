"""Findings and verdicts: what the parity engine reports.

Statuses
--------
* ``fail``: a gated value differs and no lane lets it pass.
* ``stale``: deterministic platform, the exact lane fails but the value is inside
  its declared tolerance band: the signature of golden drift after a toolchain
  change (probable stale golden). Reported, never silent; it still fails the gate.
* ``info``: an informational surface (memory, timings) left its band. Shown, but
  does not fail the gate.

A verdict's status is ``fail`` if any finding fails, else ``stale`` if any is
stale, else ``parity``. Findings are sorted (surface, section, key path) so
verdicts are deterministic for equal inputs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["Finding", "SurfaceResult", "Verdict", "Kind", "Lane", "Status"]

Kind = Literal["changed", "added", "removed", "type"]
Lane = Literal["exact", "tolerance"]
Status = Literal["fail", "stale", "info"]

_MISSING = "<absent>"


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

    def sort_key(self) -> tuple:
        return (self.surface, self.section or "", tuple(str(p) for p in self.path), self.kind)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["path"] = list(self.path)
        return out


@dataclass
class SurfaceResult:
    """Per-surface summary: how many sections were compared and which differed."""

    name: str
    gated: bool
    sections_compared: int = 0
    sections_differing: int = 0
    findings: list[Finding] = field(default_factory=list)

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
                "findings": [f.to_dict() for f in self.findings]}


@dataclass
class Verdict:
    """The result of ``compare``: one SurfaceResult per surface seen on either side."""

    deterministic: bool
    surfaces: dict[str, SurfaceResult]

    @property
    def findings(self) -> list[Finding]:
        return [f for name in sorted(self.surfaces) for f in self.surfaces[name].findings]

    @property
    def status(self) -> str:
        statuses = {s.status for s in self.surfaces.values()}
        if "fail" in statuses:
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
        return {"status": self.status, "deterministic": self.deterministic, "counts": self.counts(),
                "surfaces": {name: self.surfaces[name].to_dict() for name in sorted(self.surfaces)}}
