"""Surfaces core: canonical form, strict parsing, schemas, normalisation, digests."""

from __future__ import annotations

import copy
import math

import pytest

from harness.parity.synthetic import synthetic_surfaces
from harness.surfaces import (
    GATED_SURFACES,
    INFORMATIONAL_SURFACES,
    OPTIONAL_SURFACES,
    NonFiniteError,
    StrictJSONError,
    canonical_bytes,
    document_digest,
    loads_strict,
    normalise,
    schema_for,
    section_digests,
    validate_surface,
)


def test_six_gated_and_two_informational_surfaces():
    assert GATED_SURFACES == ("topology", "lifecycle", "operators", "collectives", "rollouts", "training")
    assert INFORMATIONAL_SURFACES == ("memory", "timings")
    assert OPTIONAL_SURFACES == ("numerics",)   # gated where a golden holds it (docs/gate.md)
    for name in GATED_SURFACES + OPTIONAL_SURFACES + INFORMATIONAL_SURFACES:
        assert schema_for(name)["properties"]["surface"] == {"const": name}


def test_canonical_bytes_sorted_compact_and_round_trip_floats():
    doc = {"b": 0.1 + 0.2, "a": [1, 1.0, True], "é": "ü"}
    text = canonical_bytes(doc).decode()
    assert text == '{"a":[1,1.0,true],"b":0.30000000000000004,"é":"ü"}'
    assert loads_strict(text) == doc


@pytest.mark.parametrize("bad,pointer", [
    ({"sections": {"step0001": {"metrics": {"loss": math.nan}}}}, "/sections/step0001/metrics/loss"),
    ({"a": [1.0, -math.inf]}, "/a/1"),
    ({"a/b": {"c~d": math.inf}}, "/a~1b/c~0d"),
])
def test_non_finite_refused_with_pointer(bad, pointer):
    with pytest.raises(NonFiniteError) as info:
        canonical_bytes(bad)
    assert info.value.pointer == pointer


@pytest.mark.parametrize("text,pointer", [
    ('{"a": NaN}', "/a"), ('{"a": [0, Infinity]}', "/a/1"), ('[-Infinity]', "/0"),
])
def test_strict_loader_refuses_nan_tokens(text, pointer):
    with pytest.raises(StrictJSONError) as info:
        loads_strict(text)
    assert info.value.pointer == pointer


def test_strict_loader_reports_syntax_errors_with_source():
    with pytest.raises(StrictJSONError, match="x.json: not valid JSON"):
        loads_strict("{", source="x.json")


def test_synthetic_surfaces_satisfy_their_schemas():
    for name, doc in synthetic_surfaces().items():
        assert validate_surface(doc) == [], name


@pytest.mark.parametrize("mutate,pointer", [
    (lambda d: d["training"]["sections"]["step0001"]["metrics"].__setitem__("loss", "high"),
     "/sections/step0001/metrics/loss"),
    (lambda d: d["training"].__setitem__("version", 2), "/version"),
    (lambda d: d["collectives"]["sections"]["policy/rank00000"]["phases"]["train/step1"]["collectives"][0].pop(),
     "/sections/policy~1rank00000/phases/train~1step1/collectives/0"),
    (lambda d: d["operators"]["sections"].__setitem__("rank0", {"phases": {}}), "/sections"),
])
def test_schema_errors_carry_pointers(mutate, pointer):
    docs = synthetic_surfaces()
    mutate(docs)
    errors = [p for name in docs for p, _ in validate_surface(docs[name])]
    assert pointer in errors


def test_unknown_surface_is_an_error():
    assert validate_surface({"surface": "losses"}) == [("/surface", ("unknown surface 'losses'; known: "
                                                         "topology, lifecycle, operators, collectives, rollouts, "
                                                         "training, numerics, memory, timings"))]


def test_normalise_drops_volatile_keys_but_not_data_names():
    doc = {"surface": "lifecycle", "version": 1, "workload": "w", "sections": {"policy/rank00000": {
        "coords": {"tp": 0}, "pid": 4242, "events": [{"event": "begin", "phase": "train/step1", "ts": 1.5,
                                                       "token": "abc", "host": "node7"}]}}}
    assert normalise(doc)["sections"]["policy/rank00000"] == {"coords": {"tp": 0},
                                                              "events": [{"event": "begin", "phase": "train/step1"}]}
    training = {"surface": "training", "version": 1, "workload": "w", "sections": {"step0001": {
        "step": 1, "wall_s": 3.0, "metrics": {"loss": 1.0, "time": 2.0, "timing/train/total_step_time": 9.0}}}}
    # "time" inside the metrics map is a metric name (kept); timing metrics are dropped by glob.
    assert normalise(training)["sections"]["step0001"] == {"step": 1, "metrics": {"loss": 1.0, "time": 2.0}}


def test_normalise_is_idempotent_and_does_not_mutate_input():
    docs = synthetic_surfaces()
    for doc in docs.values():
        before = copy.deepcopy(doc)
        once = normalise(doc)
        assert normalise(once) == once
        assert doc == before


def test_section_digests_change_only_for_the_changed_section():
    doc = synthetic_surfaces()["operators"]
    before = section_digests(doc)
    changed = copy.deepcopy(doc)
    changed["sections"]["policy/rank00002"]["phases"]["train/step1"]["operators"]["aten::op_000"] += 1
    after = section_digests(changed)
    assert {sid for sid in before if before[sid] != after[sid]} == {"policy/rank00002"}
    assert document_digest(doc) != document_digest(changed)


def test_int_and_float_have_different_digests():
    a = {"surface": "training", "version": 1, "workload": "w", "sections": {"step0001": {"metrics": {"x": 1}}}}
    b = copy.deepcopy(a)
    b["sections"]["step0001"]["metrics"]["x"] = 1.0
    assert section_digests(a) != section_digests(b)


def test_driver_section_is_allowed_only_in_informational_surfaces():
    body = {"coords": {}, "phases": {"step0001/generate": {"wall_s": 1.0}}}
    timings = {"surface": "timings", "version": 1, "workload": "w", "sections": {"driver": body}}
    assert validate_surface(timings) == []
    operators = {"surface": "operators", "version": 1, "workload": "w",
                 "sections": {"driver": {"phases": {"p": {"operators": {}}}}}}
    assert [p for p, _ in validate_surface(operators)] == ["/sections"]
