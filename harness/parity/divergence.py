"""First divergence first: order gated findings by execution and group consequences under causes.

``divergences(findings) -> list[Divergence]``: every gated finding (fail or stale) is
placed at its *execution point* and walked in that order; a finding that follows from
an earlier cause is attached to it as a consequence, any other becomes a new cause.
Informational findings (memory, timings) are never causes nor consequences.

Execution point (docs/gate.md, "First divergence first")
--------------------------------------------------------
``(step, stage, rank, surface, position, key)``:

* step: ``-1`` for the topology surface and whole-surface findings (before the run),
  ``0`` for ``engine_init`` and sections outside any step, else the N of ``stepN`` in
  the phase (``train/step2``, ``rollout/step2/attempt1``) or the section id
  (``step0002``, ``step0002-attempt1-row0003``);
* stage inside a step: rollout generation (``rollout/*`` phases, the rollouts
  surface) 0, policy training (``train/*`` phases) 1, the step's logged metrics
  (training surface) 2;
* rank: the section id with its numbers compared as numbers;
* surface: topology, lifecycle, collectives, operators, rollouts, training;
* position: the key (numbers as numbers), an ordered list's element by its index
  (golden's, else the run's); on topology ``/layout`` first (its sizes in the order
  tp, pp, cp, ep, etp, dp, then the derived edp), then ``/world_size``, ``/ranks``,
  ``/groups``.

Consequence rules, tried against each earlier cause in execution order:

1. ``after topology``: the first cause is a topology finding: every later finding
   follows from it (a rank section missing from one other surface alone is an
   ordinary cause);
2. ``same change``: the same difference as the cause (same surface and kind, the same
   element(s) for an ordered list, else the same key) on another rank, phase or step;
3. ``same rank and phase``: same section and phase as the cause or one of its
   consequences, any surface (the operator count of an inserted collective; the
   other keys of a changed rollout);
4. ``follows the data``: a data-dependent finding at a later point (step, stage) than
   the cause: training metrics, rollouts, a collective whose only changed field is
   ``numel`` (EP all-to-all split sizes follow the routed tokens) and operator counts.

The numerics surface (docs/locator.md): its first failing entry in execution order
(``harness.parity.locate``), the first diverging module, stands for the surface: every other
numerics finding is its consequence (5. ``downstream in the model``). It is placed at its
(step, stage) ahead of every other finding there, so it leads unless a cause strictly
precedes it (a changed rollout of the same step), from which it then follows (rule 4).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from harness.parity.findings import Divergence, Finding, natural_key, path_key
from harness.parity.locate import numerics_point
from harness.surfaces.canonical import canonical_bytes

__all__ = ["divergences", "execution_point", "RULES"]

RULES = ("after topology", "same change", "same rank and phase", "follows the data", "downstream in the model")

_SURFACE_ORDER = {name: i for i, name in enumerate(
    ("topology", "lifecycle", "collectives", "operators", "rollouts", "training", "memory", "timings"))}
_TOPOLOGY_KEYS = {"layout": 0, "world_size": 1, "ranks": 2, "groups": 3}
# parallel sizes as a spec sets them, then the derived ones (edp follows from the others)
_LAYOUT_ORDER = ("tp", "pp", "cp", "ep", "etp", "dp", "edp")
_STEP = re.compile(r"step0*(\d+)")


def _step(f: Finding) -> int:
    if f.surface == "topology" or f.section is None:
        return -1
    for text in (f.phase, f.section):
        if text:
            m = _STEP.search(text)
            if m:
                return int(m.group(1))
    return 0


def _stage(f: Finding) -> int:
    if f.surface == "rollouts" or (f.phase or "").startswith(("rollout/", "engine_init")):
        return 0
    if f.surface == "training":
        return 2
    return 1


def _position(f: Finding) -> int:
    if f.position:
        for side in ("golden", "actual"):
            if isinstance(f.position.get(side), int):
                return f.position[side]
    return -1


def _topology_rank(f: Finding) -> tuple[int, int]:
    if f.surface != "topology" or not f.path:
        return (9, 0)
    top = _TOPOLOGY_KEYS.get(str(f.path[0]), 9)
    inner = str(f.path[1]) if len(f.path) > 1 else ""
    return (top, _LAYOUT_ORDER.index(inner) if top == 0 and inner in _LAYOUT_ORDER else len(_LAYOUT_ORDER))


def execution_point(f: Finding) -> tuple:
    """Sort key of a finding in execution order (see the module docstring)."""
    path = f.path[:-1] + (_position(f),) if f.position else f.path   # a sequence element by its index
    return (_step(f), _stage(f), natural_key(f.section or ""), _SURFACE_ORDER.get(f.surface, 99), _topology_rank(f),
            path_key(path))


def _is_topology(f: Finding) -> bool:
    # a rank section missing from one surface only is not a changed world: the topology
    # surface says when the ranks changed
    return f.surface == "topology"


def _signature(f: Finding) -> tuple:
    if f.position is not None:
        return (f.surface, f.kind, canonical_bytes(f.golden), canonical_bytes(f.actual))
    return (f.surface, f.kind, f.key)


def _data_dependent(f: Finding) -> bool:
    if f.surface in ("training", "rollouts", "numerics"):
        return True
    if f.surface == "collectives":
        return f.kind == "changed" and tuple(f.fields) == ("numel",)
    return f.surface == "operators" and f.kind == "changed"


def _rule(cause: Divergence, f: Finding, point: tuple) -> str | None:
    c = cause.cause
    if _is_topology(c):
        return "after topology"
    if _signature(c) == _signature(f):
        return "same change"
    if c.section is not None and c.section == f.section and c.phase == f.phase:
        return "same rank and phase"
    if point[:2] > cause.point[:2] and _data_dependent(f):
        return "follows the data"
    return None


def divergences(findings: Iterable[Finding], *, primary: Finding | None = None) -> list[Divergence]:
    """Causes in execution order, each with its consequences (see the module docstring).

    ``primary``: the first diverging module (``harness.parity.locate.first_module``); every
    other numerics finding is its consequence (``downstream in the model``). It takes its
    place in execution order at its (step, stage), ahead of every other finding of the same
    (step, stage); a cause strictly before it (a rollout of the same step, an engine's
    init) stays first, and the module follows from it by rule 4 (numerics are data)."""
    findings = list(findings)
    lead: Divergence | None = None
    if primary is not None:
        lead = Divergence(cause=primary, point=numerics_point(primary, None, None))
        lead.consequences = [(RULES[4], f) for f in findings if f.surface == "numerics" and f is not primary
                             and f.status in ("fail", "stale")]
        findings = [f for f in findings if f.surface != "numerics"]
    gated = [(execution_point(f), f) for f in findings if f.status in ("fail", "stale")]
    if lead is not None:
        gated.append((lead.point[:2] + ((),), primary))   # () sorts before every rank: first at its point
    gated.sort(key=lambda item: item[0])
    out: list[Divergence] = []
    by_signature: dict[tuple, int] = {}   # rules 2 and 3 by lookup: index of the first cause that matches
    by_point: dict[tuple, int] = {}
    for point, f in gated:
        rule, at = None, None
        if out:
            rule = _rule(out[0], f, point)   # rules 1 and 4 can only pick the earliest cause first
            at = 0 if rule is not None else None
        if at is None and f is not primary:
            candidates = [(by_signature.get(_signature(f)), "same change")]
            if f.section is not None:
                candidates.append((by_point.get((f.section, f.phase)), "same rank and phase"))
            found = sorted((i, r) for i, r in candidates if i is not None)
            if found:
                at, rule = found[0]
        if at is not None and rule is not None:
            out[at].consequences.append((rule, f))
            if f is primary and lead is not None:   # the module's own consequences go with it, by its rule
                out[at].consequences.extend((rule, c) for _, c in lead.consequences)
                continue
            if f.section is not None:   # a repeat's own rank and phase belong to the same cause
                by_point.setdefault((f.section, f.phase), at)
            continue
        if f is primary and lead is not None:
            out.append(lead)
            continue
        out.append(Divergence(cause=f, point=point[:3]))
        by_signature.setdefault(_signature(f), len(out) - 1)
        if f.section is not None:
            by_point.setdefault((f.section, f.phase), len(out) - 1)
    return out
