"""Structural diff of two section bodies: every leaf difference, ordered lists as sequences.

``diff_section(surface, golden, actual) -> list[RawDiff]``. Objects are compared key by
key, plain lists position by position, leaves type-exactly (``1`` vs ``1.0`` vs ``True``
are different, ``-0.0`` is not ``0.0``). Lists registered in ``SEQUENCES`` (ordered
event lists and inventories) are aligned with a minimal edit script
(``harness.parity.sequence``): an inserted or deleted element is one difference that
names its position and its neighbours; an element replaced in place (or whose
non-key fields differ) is one ``changed`` difference naming the fields that differ.

Symmetry: ``RawDiff.path`` is the same for (g, a) and (a, g) (sequence positions use the
index of the side the alignment put first); ``key_path`` is what a user reads (golden
index when the element exists there, else the run's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from harness.parity.findings import _MISSING
from harness.parity.sequence import align
from harness.surfaces.canonical import canonical_bytes

__all__ = ["RawDiff", "SequenceSpec", "SEQUENCES", "diff_section", "typed_equal"]


@dataclass(frozen=True)
class SequenceSpec:
    """An ordered list inside a section body: ``path`` (``*`` matches any one key);
    ``fields`` names the positions of a list-shaped element (None: dict elements name
    their own fields); ``key_fields``: how many leading fields align the sequence (the
    rest may change in place: a collective's numel follows the data)."""

    path: tuple[str, ...]
    fields: tuple[str, ...] | None = None
    key_fields: int | None = None


SEQUENCES: dict[str, tuple[SequenceSpec, ...]] = {
    "collectives": (SequenceSpec(("phases", "*", "collectives"), ("op", "group", "dtype", "numel"), 3),),
    "lifecycle": (SequenceSpec(("events",)),),
    "rollouts": (SequenceSpec(("calls",)),),
}


@dataclass
class RawDiff:
    path: tuple
    kind: str                       # changed | added | removed | type
    golden: Any = _MISSING
    actual: Any = _MISSING
    key_path: tuple | None = None   # user-facing path (None: same as path)
    position: dict | None = None    # sequence findings: golden/actual index, neighbours
    fields: tuple[str, ...] = field(default_factory=tuple)


def typed_equal(x: Any, y: Any) -> bool:
    """JSON equality keeping int, float and bool apart and -0.0 apart from 0.0."""
    if type(x) is not type(y):
        return False
    if type(x) is list:
        return len(x) == len(y) and all(typed_equal(p, q) for p, q in zip(x, y))
    if type(x) is dict:
        return x.keys() == y.keys() and all(typed_equal(x[k], y[k]) for k in x)
    if type(x) is float:
        return x == y and (x != 0.0 or math.copysign(1.0, x) == math.copysign(1.0, y))
    return x == y


def _token(element: Any) -> Any:
    """A hashable, type-exact stand-in for an element (== iff typed_equal)."""
    if type(element) is str or type(element) is int:
        return (type(element).__name__, element)
    if type(element) is list and all(type(p) is str or type(p) is int for p in element):
        return tuple((type(p).__name__, p) for p in element)
    return canonical_bytes(element)


def _key(spec: SequenceSpec) -> Callable[[Any], Any]:
    n = spec.key_fields
    if n is None:
        return _token
    return lambda e: _token(e[:n]) if type(e) is list else _token(e)


def _order(values: list) -> bytes:
    return canonical_bytes(values)


def _spec_for(surface: str, path: tuple) -> SequenceSpec | None:
    for spec in SEQUENCES.get(surface, ()):
        if len(spec.path) == len(path) and all(fnmatchcase(str(p), s) for p, s in zip(path, spec.path)):
            return spec
    return None


def _differing_fields(spec: SequenceSpec, g: Any, a: Any) -> tuple[str, ...]:
    if isinstance(g, list) and isinstance(a, list):
        names = spec.fields or ()
        out = [names[i] if i < len(names) else str(i) for i in range(max(len(g), len(a)))
               if i >= len(g) or i >= len(a) or not typed_equal(g[i], a[i])]
        return tuple(out)
    if isinstance(g, Mapping) and isinstance(a, Mapping):
        return tuple(sorted(str(k) for k in set(g) | set(a) if k not in g or k not in a or not typed_equal(g[k], a[k])))
    return ()


def _neighbours(values: list, index: int) -> dict:
    return {"before": values[index - 1] if index > 0 else None,
            "after": values[index + 1] if index + 1 < len(values) else None}


def _trim(golden: list, actual: list) -> tuple[int, int]:
    """Lengths of the common prefix and suffix (``==`` scan, then one type-exact check)."""
    n, m = len(golden), len(actual)
    lo = 0
    while lo < n and lo < m and golden[lo] == actual[lo]:
        lo += 1
    hi = 0
    while hi < n - lo and hi < m - lo and golden[n - 1 - hi] == actual[m - 1 - hi]:
        hi += 1
    if (canonical_bytes(golden[:lo]) != canonical_bytes(actual[:lo])
            or canonical_bytes(golden[n - hi:]) != canonical_bytes(actual[m - hi:])):
        return 0, 0   # equal by == but not by type (1 vs 1.0 vs True): align it all, type-exactly
    return lo, hi


def _diff_sequence(spec: SequenceSpec, golden: list, actual: list, path: tuple, out: list[RawDiff]) -> None:
    n, m = len(golden), len(actual)
    lo, hi = _trim(golden, actual)
    if lo == n == m:
        return
    mid_g, mid_a = golden[lo:n - hi], actual[lo:m - hi]
    alignment = align(mid_g, mid_a, key=_key(spec), order=_order)
    golden_first = _order(mid_g) <= _order(mid_a)
    for i, j in alignment.matches:   # key fields match; the rest may differ (a numel)
        if _token(mid_g[i]) != _token(mid_a[j]):
            out.append(_changed(spec, golden, actual, path, lo + i, lo + j, golden_first))
    for hunk in alignment.hunks:
        for i, j in hunk.changed:
            out.append(_changed(spec, golden, actual, path, lo + i, lo + j, golden_first))
        for i in hunk.removed:
            out.append(RawDiff(path=path + (lo + i,), kind="removed", golden=golden[lo + i],
                               position={"golden": lo + i, "actual": None,
                                         "run_at": lo + hunk.at[1] + len(hunk.changed),
                                         **_neighbours(golden, lo + i)}))
        for j in hunk.added:
            out.append(RawDiff(path=path + (lo + j,), kind="added", actual=actual[lo + j],
                               position={"golden": None, "actual": lo + j,
                                         "golden_at": lo + hunk.at[0] + len(hunk.changed),
                                         **_neighbours(actual, lo + j)}))


def _changed(spec: SequenceSpec, golden: list, actual: list, path: tuple, i: int, j: int,
             golden_first: bool) -> RawDiff:
    return RawDiff(path=path + ((i if golden_first else j),), key_path=path + (i,), kind="changed",
                   golden=golden[i], actual=actual[j], fields=_differing_fields(spec, golden[i], actual[j]),
                   position={"golden": i, "actual": j, **_neighbours(golden, i)})


def _diff(surface: str, g: Any, a: Any, path: tuple, out: list[RawDiff]) -> None:
    if type(g) is dict and type(a) is dict:
        for k in g:
            if k not in a:
                out.append(RawDiff(path=path + (k,), kind="removed", golden=g[k]))
            else:
                _diff(surface, g[k], a[k], path + (k,), out)
        for k in a:
            if k not in g:
                out.append(RawDiff(path=path + (k,), kind="added", actual=a[k]))
        return
    if type(g) is list and type(a) is list:
        spec = _spec_for(surface, path)
        if spec is not None:
            _diff_sequence(spec, g, a, path, out)
            return
        for i in range(min(len(g), len(a))):
            _diff(surface, g[i], a[i], path + (i,), out)
        out.extend(RawDiff(path=path + (i,), kind="removed", golden=g[i]) for i in range(len(a), len(g)))
        out.extend(RawDiff(path=path + (i,), kind="added", actual=a[i]) for i in range(len(g), len(a)))
        return
    if type(g) is not type(a):
        out.append(RawDiff(path=path, kind="type", golden=g, actual=a))
    elif not typed_equal(g, a):
        out.append(RawDiff(path=path, kind="changed", golden=g, actual=a))


def diff_section(surface: str, golden: Any, actual: Any) -> list[RawDiff]:
    """Every difference between two section bodies (empty iff they are typed-equal)."""
    out: list[RawDiff] = []
    _diff(surface, golden, actual, (), out)
    return out
