"""Comparator properties (hypothesis, `ci` profile from suites/conftest.py)."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from harness.parity import ToleranceTable, compare
from harness.surfaces import SURFACES, ToleranceRule, canonical_bytes, normalise, section_digests

scalars = (st.none() | st.booleans() | st.integers(-10**6, 10**6)
           | st.floats(allow_nan=False, allow_infinity=False, width=64) | st.text(max_size=4))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=3), inner, max_size=4), max_leaves=16)
# Keys include volatile names and opaque-map names so normalisation has work to do.
keys = st.sampled_from(["a", "b", "ts", "pid", "host", "metrics", "operators", "phases", "events", "wall_s", "token"])
section_bodies = st.dictionaries(keys, json_values, max_size=5)
section_maps = st.dictionaries(st.sampled_from(["s1", "s2", "s3"]), section_bodies, max_size=3)
surface_names = st.sampled_from(sorted(SURFACES))


def doc(name, sections):
    return {"surface": name, "version": 1, "workload": "w", "sections": sections}


def typed_equal(x, y) -> bool:
    """JSON equality that keeps int/float/bool apart and -0.0 apart from 0.0."""
    if type(x) is not type(y):
        return False
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(typed_equal(x[k], y[k]) for k in x)
    if isinstance(x, list):
        return len(x) == len(y) and all(typed_equal(a, b) for a, b in zip(x, y))
    if isinstance(x, float):
        return repr(x) == repr(y)
    return x == y


def projection(f, swap=False):
    """What must mirror under golden/actual exchange (coords/phase come from the golden side
    when both have them, and rel_err is relative to golden, so they are left out)."""
    kind = {"added": "removed", "removed": "added"}.get(f.kind, f.kind) if swap else f.kind
    golden, actual = (f.actual, f.golden) if swap else (f.golden, f.actual)
    return (f.surface, f.section, tuple(map(str, f.path)), kind, f.lane, f.status, f.abs_err,
            canonical_bytes(golden), canonical_bytes(actual))


@given(surface_names, section_maps)
def test_self_diff_is_empty(name, sections):
    d = doc(name, sections)
    verdict = compare({name: d}, {name: copy.deepcopy(d)})
    assert verdict.findings == [] and verdict.status == "parity"


@given(surface_names, section_maps, section_maps, st.booleans())
def test_findings_are_symmetric(name, g_sections, a_sections, deterministic):
    g, a = doc(name, g_sections), doc(name, a_sections)
    forward = sorted(projection(f) for f in compare({name: g}, {name: a}, deterministic=deterministic).findings)
    backward = sorted(
        projection(f, swap=True) for f in compare({name: a}, {name: g}, deterministic=deterministic).findings
    )
    assert forward == backward


finite = st.floats(-1e6, 1e6, allow_nan=False)
metric_maps = st.dictionaries(st.sampled_from(["loss", "kl", "reward", "grad_norm"]), finite, min_size=1, max_size=4)
bounds = st.tuples(st.floats(0, 10), st.floats(0, 2))


@given(metric_maps, st.lists(finite, min_size=4, max_size=4), bounds, bounds,
       st.sampled_from(["always", "nondeterministic"]), st.booleans())
def test_looser_tolerance_never_fails_what_tighter_passes(golden_metrics, deltas, b1, b2, when, deterministic):
    tight = (min(b1[0], b2[0]), min(b1[1], b2[1]))
    loose = (max(b1[0], b2[0]), max(b1[1], b2[1]))
    actual_metrics = {k: v + d for (k, v), d in zip(sorted(golden_metrics.items()), deltas)}
    g = {"training": doc("training", {"step0001": {"metrics": golden_metrics}})}
    a = {"training": doc("training", {"step0001": {"metrics": actual_metrics}})}

    def failing(bound):
        table = ToleranceTable([ToleranceRule("training", "metrics.*", abs=bound[0], rel=bound[1], when=when,
                                              reason="property test")], include_defaults=False)
        return {
            f.key for f in compare(g, a, tolerances=table, deterministic=deterministic).findings if f.status == "fail"
        }

    assert failing(loose) <= failing(tight)


@given(surface_names, section_maps)
def test_normalisation_is_idempotent(name, sections):
    once = normalise(doc(name, sections))
    assert normalise(once) == once
    assert canonical_bytes(normalise(once)) == canonical_bytes(once)


@given(json_values, json_values)
def test_equal_canonical_bytes_iff_typed_equal(x, y):
    assert (canonical_bytes(x) == canonical_bytes(y)) == typed_equal(x, y)
    assert canonical_bytes(x) == canonical_bytes(copy.deepcopy(x))


@given(section_maps, section_maps)
def test_equal_digests_iff_equal_canonical_forms(s1, s2):
    d1, d2 = section_digests(doc("rollouts", s1)), section_digests(doc("rollouts", s2))
    for sid in set(s1) & set(s2):
        assert (d1[sid] == d2[sid]) == (canonical_bytes(s1[sid]) == canonical_bytes(s2[sid]))
