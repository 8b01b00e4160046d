"""The parity comparison: golden vs actual surface documents -> Verdict.

Algorithm
---------
1. Per surface present on either side: a surface missing on one side is one finding.
2. Both sides are normalised (volatile keys dropped) and the envelope (version,
   workload) compared.
3. Fast path: sha256 of each section's canonical bytes. Equal digests mean equal
   sections and cost no further work; only differing sections are diffed.
4. A differing section is diffed structurally (``harness.parity.walk``): objects key
   by key, plain lists position by position, leaves type-exactly (``-0.0`` is not
   ``0.0``, ``1`` is not ``1.0``); ordered event lists (collectives per rank and
   phase, lifecycle events, a rollout's calls) are aligned with a minimal edit script
   (``harness.parity.sequence``), so an inserted collective is one ``added`` finding
   naming its position and neighbours, and a changed one is one ``changed`` finding
   naming the fields that differ.
5. Each leaf difference is classified into a lane and a status (``findings``).
6. The verdict's gated findings are ordered by execution and grouped into causes and
   their consequences (``harness.parity.divergence``).

Invariants (property-tested in suites/property/test_parity_props.py): comparing a
document with itself yields no findings; findings of (g, a) and (a, g) correspond
one to one with golden/actual and added/removed exchanged; loosening a tolerance
never turns a pass into a failure; a section is diffed iff its digests differ.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from harness.parity.divergence import divergences
from harness.parity.findings import _MISSING, Finding, SurfaceResult, Verdict
from harness.parity.locate import first_module
from harness.parity.tolerances import ToleranceTable
from harness.parity.walk import RawDiff, diff_section
from harness.surfaces.canonical import canonical_bytes, json_pointer
from harness.surfaces.digest import section_digests
from harness.surfaces.registry import SURFACES, ToleranceRule, normalise

__all__ = ["compare", "compare_surface"]

def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _coords_of(section: Any) -> dict | None:
    if isinstance(section, Mapping) and isinstance(section.get("coords"), Mapping):
        return dict(section["coords"])
    return None


def _coords(golden: Any, actual: Any) -> tuple[dict | None, dict | None]:
    """(the run's coordinates, the golden's where they differ from the run's)."""
    run, gold = _coords_of(actual), _coords_of(golden)
    if run is None:
        return gold, None
    return run, (gold if gold is not None and gold != run else None)


def _phase_and_key(surface: str, section_id: str, path: tuple, golden: Any, actual: Any) -> tuple[str | None, str]:
    """Split a path inside a section into (phase or step, JSON pointer of the rest)."""
    if len(path) >= 2 and path[0] == "phases":
        return str(path[1]), json_pointer(path[2:])
    if surface == "training":
        return section_id, json_pointer(path)
    if surface == "numerics" and len(path) >= 2 and path[0] == "entries" and str(path[1]).count("/") >= 3:
        step, phase, mb, entry = str(path[1]).split("/", 3)   # stepNNNN/<phase>/mbMMM/<module>#<call>
        return f"{step}/{phase}/{mb}", json_pointer((entry, *path[2:]))
    if len(path) >= 2 and path[0] == "events" and isinstance(path[1], int):
        for side in (golden, actual):
            if isinstance(side, Mapping) and side.get("phase") is not None:
                return str(side["phase"]), json_pointer(path)
        return None, json_pointer(path)
    return None, json_pointer(path)


def _canonical_residuals(golden: Any, actual: Any, path: tuple = ()) -> list[tuple]:
    """Paths of leaves whose canonical bytes differ although the walk saw them equal (safety net)."""
    if isinstance(golden, Mapping) and isinstance(actual, Mapping):
        return [p for key in golden if key in actual
                for p in _canonical_residuals(golden[key], actual[key], path + (key,))]
    if isinstance(golden, list) and isinstance(actual, list):
        return [p for i, (g, a) in enumerate(zip(golden, actual)) for p in _canonical_residuals(g, a, path + (i,))]
    if canonical_bytes(golden) != canonical_bytes(actual):
        return [path]
    return []


def _errors(golden: float, actual: float) -> tuple[float | None, float | None]:
    """(abs, rel) error of a numeric pair; None where not a finite float (an integer pair
    too large for a float, an overflow): such a pair is still compared, exactly."""
    try:
        abs_err = float(abs(actual - golden))
    except OverflowError:
        return None, None
    abs_err = abs_err if math.isfinite(abs_err) else None
    try:
        rel_err = (abs_err / abs(golden)) if (abs_err is not None and golden != 0) else None
    except OverflowError:
        rel_err = None
    rel_err = rel_err if rel_err is not None and math.isfinite(rel_err) else None
    return abs_err, rel_err


def _classify(*, surface: str, gated: bool, section: str, path: tuple, kind: str, golden: Any, actual: Any,
              coords: dict | None, phase: str | None, key: str, table: ToleranceTable,
              deterministic: bool, tolerated: list[Finding] | None = None, **extra: Any) -> Finding | None:
    """Lane and status of one leaf difference; None when a tolerance lane passes it (a
    gated one is then appended to ``tolerated``, so the report names the rule)."""
    base = dict(surface=surface, section=section, path=path, kind=kind, coords=coords, phase=phase, key=key,
                golden=golden, actual=actual, **extra)
    failed = "fail" if gated else "info"
    if kind in ("added", "removed") or not (_is_number(golden) and _is_number(actual)):
        return Finding(lane="exact", status=failed, **base)
    if kind == "type" and type(golden) is type(actual):
        kind = base["kind"] = "changed"
    abs_err, rel_err = _errors(golden, actual)
    base.update(abs_err=abs_err, rel_err=rel_err)
    rule: ToleranceRule | None = table.lookup(surface, section, ".".join(str(p) for p in path))
    if rule is None:
        return Finding(lane="exact", status=failed, **base)
    inside = rule.passes(golden, actual)
    band = {"abs": rule.abs, "rel": rule.rel, "when": rule.when, "reason": rule.reason, "inside": inside,
            "rule": rule.source}
    if rule.when == "always" or not deterministic:
        if inside:
            if gated and tolerated is not None:  # the rule turned a failure into a pass: the report names it
                tolerated.append(Finding(lane="tolerance", status="info", tolerance=band,
                                         note=f"passed by the tolerance lane: {rule.source}", **base))
            return None
        return Finding(lane="tolerance", status=failed, tolerance=band, **base)
    if inside and gated:
        return Finding(lane="exact", status="stale", tolerance=band,
                       note="exact lane fails, tolerance lane passes: probable stale golden", **base)
    return Finding(lane="exact", status=failed, tolerance=band, **base)


def _diff_section(surface: str, gated: bool, section_id: str, golden: Any, actual: Any,
                  table: ToleranceTable, deterministic: bool, tolerated: list[Finding] | None = None) -> list[Finding]:
    coords, golden_coords = _coords(golden, actual)
    diffs = diff_section(surface, golden, actual)
    if not diffs:   # the digests differ, so something does: say where (never a silent pass)
        diffs = [RawDiff(path=p, kind="changed", golden=_get(golden, p), actual=_get(actual, p))
                 for p in _canonical_residuals(golden, actual)] or [
                 RawDiff(path=(), kind="changed", golden=golden, actual=actual)]
    findings = []
    for d in diffs:
        key_path = d.key_path if d.key_path is not None else d.path
        element = d.golden if d.golden is not _MISSING else d.actual
        phase, key = _phase_and_key(surface, section_id, key_path, element if d.position else None,
                                    d.actual if d.position else None)
        finding = _classify(surface=surface, gated=gated, section=section_id, path=d.path, kind=d.kind,
                            golden=d.golden, actual=d.actual, coords=coords, phase=phase, key=key, table=table,
                            deterministic=deterministic, tolerated=tolerated, golden_coords=golden_coords,
                            position=d.position, fields=d.fields)
        if finding is not None:
            findings.append(finding)
    return findings


def _get(node: Any, path: tuple) -> Any:
    for part in path:
        if isinstance(node, Mapping) and part in node:  # noqa: SIM114 - one branch per container kind
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return _MISSING
    return node


def compare_surface(name: str, golden: Mapping[str, Any] | None, actual: Mapping[str, Any] | None, *,
                    tolerances: ToleranceTable | Sequence[ToleranceRule] | None = None,
                    deterministic: bool = True, normalised: bool = False) -> SurfaceResult:
    """Compare one surface (either side may be None: the surface is missing there)."""
    if name not in SURFACES:
        raise ValueError(f"unknown surface {name!r}; known: {', '.join(SURFACES)}")
    table = ToleranceTable.coerce(tolerances)
    gated = SURFACES[name].gated
    result = SurfaceResult(name=name, gated=gated)
    failed = "fail" if gated else "info"
    if golden is None and actual is not None and SURFACES[name].optional:
        # a golden stored before the surface existed: every other surface is still checked
        # (docs/gate.md, "Optional surfaces"); never a silent pass, never a failure
        result.findings.append(Finding(surface=name, section=None, kind="added", lane="exact", status="info",
                                       golden=_MISSING, actual=name,
                                       note=f"surface {name} is not in this golden (refresh to gate it)"))
        return result
    if golden is None or actual is None:
        kind = "removed" if actual is None else "added"
        result.findings.append(Finding(surface=name, section=None, kind=kind, lane="exact", status=failed,
                                       golden=name if golden is not None else _MISSING,
                                       actual=name if actual is not None else _MISSING,
                                       note=f"surface {name} is missing from the "
                                            f"{'actual run' if actual is None else 'golden'}"))
        return result
    for side, doc in (("golden", golden), ("actual", actual)):
        if doc.get("surface") != name:
            raise ValueError(f"{side} document for surface {name!r} says surface={doc.get('surface')!r}")
    if not normalised:
        golden, actual = normalise(golden), normalise(actual)
    for field in ("version", "workload"):
        if golden.get(field) != actual.get(field):
            result.findings.append(Finding(surface=name, section=None, kind="changed", lane="exact", status=failed,
                                           key=f"/{field}", path=(field,), golden=golden.get(field, _MISSING),
                                           actual=actual.get(field, _MISSING)))
    g_digests, a_digests = section_digests(golden), section_digests(actual)
    g_sections, a_sections = golden["sections"], actual["sections"]
    for section_id in sorted(set(g_digests) | set(a_digests)):
        result.sections_compared += 1
        if g_digests.get(section_id) == a_digests.get(section_id):
            continue
        result.sections_differing += 1
        if section_id not in a_digests or section_id not in g_digests:
            present = g_sections.get(section_id, a_sections.get(section_id))
            result.findings.append(Finding(
                surface=name, section=section_id, kind="removed" if section_id not in a_digests else "added",
                lane="exact", status=failed, coords=_coords_of(present),
                golden=section_id if section_id in g_digests else _MISSING,
                actual=section_id if section_id in a_digests else _MISSING,
                note=f"section {section_id} is missing from the "
                     f"{'actual run' if section_id not in a_digests else 'golden'}"))
            continue
        tolerated: list[Finding] = []
        result.findings.extend(_diff_section(name, gated, section_id, g_sections[section_id],
                                             a_sections[section_id], table, deterministic, tolerated))
        for finding in tolerated:
            result.note_tolerated(finding)
    result.findings.sort(key=Finding.sort_key)
    return result


def compare(golden_docs: Mapping[str, Mapping[str, Any]], actual_docs: Mapping[str, Mapping[str, Any]], *,
            tolerances: ToleranceTable | Sequence[ToleranceRule] | None = None,
            deterministic: bool = True, lane_source: str = "") -> Verdict:
    """Compare surfaces by name. Unknown surface names or a document whose ``surface``
    field disagrees with its name raise ValueError (unusable input); documents must be
    free of NaN/inf (NonFiniteError otherwise). ``lane_source`` says what chose the lane
    mode (``tolerances.yaml#/deterministic``, ``--nondeterministic``): the report header names it."""
    table = ToleranceTable.coerce(tolerances)
    surfaces = {}
    for name in sorted(set(golden_docs) | set(actual_docs)):
        surfaces[name] = compare_surface(name, golden_docs.get(name), actual_docs.get(name),
                                         tolerances=table, deterministic=deterministic)
    primary = None
    if "numerics" in surfaces:   # the first diverging module leads (docs/locator.md)
        result = surfaces["numerics"]
        located = first_module(result.findings, golden_docs.get("numerics"), actual_docs.get("numerics"))
        if located is not None:
            first, primary = located
            result.findings = [primary if f is first else f for f in result.findings]
    verdict = Verdict(deterministic=deterministic, surfaces=surfaces, lane_source=lane_source)
    verdict.divergences = divergences(verdict.findings, primary=primary)
    return verdict
