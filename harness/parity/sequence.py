"""Minimal edit scripts between two ordered lists (Myers' O((N+M)D) greedy diff).

``align(golden, actual, key=...)`` returns the matched index pairs of a longest
common subsequence of ``key(element)`` values, plus the *hunks* between them, each
split into element pairs that changed in place and elements only one side has.

Contract
--------
* Symmetric: ``align(a, b)`` and ``align(b, a)`` describe the same alignment with
  the sides exchanged. Myers' tie-breaking prefers one side, so the script is always
  computed in one orientation (the side whose canonical bytes sort first goes first)
  and mapped back.
* Bounded: a common prefix and suffix are stripped first (an edit near the end of a
  long list costs a linear scan), and the search gives up after ``max_d`` edits;
  the middle is then aligned position by position (``Alignment.bounded`` is True),
  which is what the engine did for every list before.
* Keys are compared with ``==``; callers pass hashable, type-exact keys.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Alignment", "Hunk", "align", "myers_matches"]

MAX_D = 256


@dataclass
class Hunk:
    """What lies between two matched positions: ``changed`` pairs (golden index, actual
    index) of elements replaced in place, then ``removed`` golden indices and ``added``
    actual indices that have no counterpart. ``at`` is (golden, actual) index where the
    hunk starts."""

    at: tuple[int, int]
    changed: list[tuple[int, int]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    added: list[int] = field(default_factory=list)


@dataclass
class Alignment:
    matches: list[tuple[int, int]]
    hunks: list[Hunk]
    bounded: bool = False   # True when the search hit max_d and the middle was aligned by position


def myers_matches(a: Sequence[Any], b: Sequence[Any], max_d: int = MAX_D) -> list[tuple[int, int]] | None:
    """Matched (i, j) pairs of a shortest edit script of ``a`` -> ``b``; None beyond ``max_d`` edits."""
    n, m = len(a), len(b)
    v: dict[int, int] = {1: 0}
    trace: list[dict[int, int]] = []
    for d in range(min(n + m, max_d) + 1):
        trace.append(dict(v))
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[k - 1] < v[k + 1]):
                x = v[k + 1]          # step down: an insertion from b
            else:
                x = v[k - 1] + 1      # step right: a deletion from a
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x, y = x + 1, y + 1
            v[k] = x
            if x >= n and y >= m:
                return _backtrack(trace, n, m, d)
    return None


def _backtrack(trace: list[dict[int, int]], n: int, m: int, depth: int) -> list[tuple[int, int]]:
    matches: list[tuple[int, int]] = []
    x, y = n, m
    for d in range(depth, 0, -1):
        v = trace[d]
        k = x - y
        prev_k = k + 1 if (k == -d or (k != d and v[k - 1] < v[k + 1])) else k - 1
        prev_x = v[prev_k]
        prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y:
            x, y = x - 1, y - 1
            matches.append((x, y))
        x, y = prev_x, prev_y
    while x > 0 and y > 0:
        x, y = x - 1, y - 1
        matches.append((x, y))
    matches.reverse()
    return matches


def _hunks(matches: list[tuple[int, int]], n: int, m: int) -> list[Hunk]:
    out = []
    gi = ai = 0
    for i, j in [*matches, (n, m)]:
        if i > gi or j > ai:
            gaps_g, gaps_a = list(range(gi, i)), list(range(ai, j))
            pairs = min(len(gaps_g), len(gaps_a))
            out.append(Hunk(at=(gi, ai), changed=list(zip(gaps_g[:pairs], gaps_a[:pairs])),
                            removed=gaps_g[pairs:], added=gaps_a[pairs:]))
        gi, ai = i + 1, j + 1
    return out


def align(golden: Sequence[Any], actual: Sequence[Any], *, key: Callable[[Any], Any],
          order: Callable[[Sequence[Any]], Any], max_d: int = MAX_D) -> Alignment:
    """Align two lists by ``key``; ``order(list)`` gives a sortable form of a whole list
    (canonical bytes), which fixes the orientation so the result is symmetric."""
    n, m = len(golden), len(actual)
    kg, ka = [key(e) for e in golden], [key(e) for e in actual]
    lo = 0
    while lo < n and lo < m and kg[lo] == ka[lo]:
        lo += 1
    hi = 0
    while hi < n - lo and hi < m - lo and kg[n - 1 - hi] == ka[m - 1 - hi]:
        hi += 1
    mid_g, mid_a = kg[lo:n - hi], ka[lo:m - hi]
    swap = order(golden) > order(actual)
    x, y = (mid_a, mid_g) if swap else (mid_g, mid_a)
    inner = myers_matches(x, y, max_d)
    bounded = inner is None
    if inner is None:
        inner = [(i, i) for i in range(min(len(x), len(y))) if x[i] == y[i]]
    if swap:
        inner = [(j, i) for i, j in inner]
    matches = ([(i, i) for i in range(lo)] + [(lo + i, lo + j) for i, j in inner]
               + [(n - hi + t, m - hi + t) for t in range(hi)])
    if bounded:   # position by position: every gap pairs up in place
        same = {i for i, _ in inner}
        common = min(len(x), len(y))
        hunk = Hunk(at=(lo, lo), changed=[(lo + t, lo + t) for t in range(common) if t not in same],
                    removed=list(range(lo + common, n - hi)), added=list(range(lo + common, m - hi)))
        hunks = [hunk] if hunk.changed or hunk.removed or hunk.added else []
    else:
        hunks = _hunks(matches, n, m)
    return Alignment(matches=matches, hunks=hunks, bounded=bounded)
