"""Mutated-invalid workload specs and manifests, derived from the JSON Schemas (issue 8 item 8).

``mutation_sites`` walks a valid document alongside its schema
(``harness/spec/workload.schema.json``, ``harness/manifest/manifest.v2.json``)
and lists every single-site mutation the schema forbids: a wrong type, an
unknown key (``additionalProperties: false``), a missing required key, a
number out of range (``minimum`` / ``maximum`` / exclusive bounds), NaN and
infinities where the schema allows numbers, a value outside an ``enum`` /
``const``, a string shorter than ``minLength`` or not matching ``pattern``,
an array shorter than ``minItems``.

Properties: every mutated document is rejected, the error names exactly the
mutated field path (dotted ``SpecError.field`` for specs, JSON pointers for
manifests), and the validators never raise anything else. Hypothesis draws a
base document, a site and a mutation; one example = one invalid document, so
the ``nightly`` profile (max_examples=2000) produces 2000 invalid specs and
2000 invalid manifests per run. The exhaustive tests run every site x
mutation of the base documents once in every profile.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.manifest import validate_manifest
from harness.manifest.validate import manifest_schema
from harness.spec import SpecError
from harness.spec.schema import fill_defaults, load_schema, validate
from harness.spec.yaml_io import load_yaml_file

REPO = Path(__file__).resolve().parents[2]
UNKNOWN_KEY = "zz_unknown_key"
# at least the profile's examples, never fewer than 300 (cheap: no I/O, one validation)
FUZZ = settings(max_examples=max(300, settings().max_examples), deadline=None)

# candidate replacement values for a wrong-type mutation
TYPE_CANDIDATES = ["zz", 7, True, None, [], {}, 0.5]


def _matches_type(t: str, v) -> bool:
    """Lenient JSON type check (a candidate is 'wrong' only if no validator could accept it)."""
    if t == "integer":
        return (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, float)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return {
        "string": lambda: isinstance(v, str),
        "boolean": lambda: isinstance(v, bool),
        "null": lambda: v is None,
        "array": lambda: isinstance(v, list),
        "object": lambda: isinstance(v, dict),
    }[t]()


def _types(schema) -> list[str]:
    t = schema.get("type")
    return [t] if isinstance(t, str) else list(t or [])


def _walk(value, schema, path):
    """(path, subschema, value) for the node and every descendant the schema describes."""
    yield path, schema, value
    if "oneOf" in schema or "anyOf" in schema:
        return  # the container is what is reported
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            child = props.get(key, extra if isinstance(extra, dict) else None)
            if isinstance(child, dict):
                yield from _walk(sub, child, path + [key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, sub in enumerate(value):
            yield from _walk(sub, schema["items"], path + [i])


def mutation_sites(doc, schema) -> list[tuple[str, tuple, object]]:
    """Every (kind, target path, argument) single-site mutation the schema forbids."""
    out = []
    for path, sub, value in _walk(doc, schema, []):
        path = tuple(path)
        types = _types(sub)
        if types:
            for cand in TYPE_CANDIDATES:
                if not any(_matches_type(t, cand) for t in types):
                    out.append(("wrong_type", path, cand))
        if isinstance(value, dict):
            if sub.get("additionalProperties") is False:
                out.append(("unknown_key", path + (UNKNOWN_KEY,), 1))
            for key in sub.get("required", []):
                if key in value:
                    out.append(("missing_required", path + (key,), None))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            integer = "number" not in types
            step = 1 if integer else 0.5
            if "minimum" in sub:
                out.append(("out_of_range", path, sub["minimum"] - step))
            if "exclusiveMinimum" in sub:
                out.append(("out_of_range", path, sub["exclusiveMinimum"]))
            if "maximum" in sub:
                out.append(("out_of_range", path, sub["maximum"] + step))
            if "exclusiveMaximum" in sub:
                out.append(("out_of_range", path, sub["exclusiveMaximum"]))
            if "number" in types:
                for x in (math.nan, math.inf, -math.inf):
                    out.append(("non_finite", path, x))
        if "enum" in sub:
            out.append(("bad_enum", path, "zz_not_a_choice"))
        if "const" in sub:
            out.append(("bad_enum", path, "zz_not_the_const"))
        if isinstance(value, str):
            if sub.get("minLength", 0) >= 1:
                out.append(("too_short", path, ""))
            if "pattern" in sub and not re.search(sub["pattern"], "\t zz!"):
                out.append(("pattern", path, "\t zz!"))
        if isinstance(value, list) and sub.get("minItems", 0) >= 1:
            out.append(("too_short", path, []))
    return out


def apply_mutation(doc, mutation):
    kind, path, arg = mutation
    if not path:
        return copy.deepcopy(arg)  # the whole document replaced
    out = copy.deepcopy(doc)
    node = out
    for part in path[:-1]:
        node = node[part]
    if kind == "missing_required":
        del node[path[-1]]
    else:
        node[path[-1]] = arg
    return out


def dotted(path) -> str:
    return ".".join(str(p) for p in path) or "(root)"


def pointer(path) -> str:
    return "".join(f"/{str(p).replace('~', '~0').replace('/', '~1')}" for p in path)


# -- base documents -----------------------------------------------------------------------

MODEL = {"layers": 4, "hidden": 64, "heads": 8, "kv_heads": 2, "head_dim": 16, "experts": 8,
         "top_k": 2, "moe_intermediate": 32, "vocab": 256}


def _spec_bases():
    bases = [fill_defaults({"name": "fuzz", "model": dict(MODEL)}),
             {"name": "fuzz", "model": dict(MODEL)}]  # the minimal form, defaults not written
    for path in sorted((REPO / "goldens").glob("*/workload.yaml")):
        bases.append(fill_defaults(load_yaml_file(path)))
    return bases


def _manifest_bases():
    bases = []
    for path in sorted((REPO / "goldens").glob("*/*/manifest.json")):
        bases.append(json.loads(path.read_text()))
    return bases


SPEC_SCHEMA = load_schema()
MANIFEST_SCHEMA = manifest_schema()
SPEC_BASES = _spec_bases()
MANIFEST_BASES = _manifest_bases()
SPEC_CASES = [(i, m) for i, doc in enumerate(SPEC_BASES) for m in mutation_sites(doc, SPEC_SCHEMA)]
MANIFEST_CASES = [(i, m) for i, doc in enumerate(MANIFEST_BASES) for m in mutation_sites(doc, MANIFEST_SCHEMA)]


def _exhaustive(cases):
    """Array entries past the second repeat their schema: the exhaustive tests skip
    them (the hypothesis tests still draw from all cases)."""
    return [(i, m) for i, m in cases if all(not isinstance(p, int) or p < 2 for p in m[1])]


def spec_rejection(doc, mutation):
    """None when the validator rejected ``doc`` naming the mutated field, else a complaint."""
    try:
        validate(doc)
    except SpecError as exc:
        if exc.field != dotted(mutation[1]):
            return f"error names {exc.field!r}, mutated {dotted(mutation[1])!r}: {exc}"
        return None
    return "accepted"


def manifest_rejection(doc, mutation):
    errors = validate_manifest(doc)
    want = pointer(mutation[1])
    if not errors:
        return "accepted"
    if {e.pointer for e in errors} != {want}:
        return f"errors at {[str(e) for e in errors]}, mutated {want!r}"
    return None


def test_bases_are_valid_and_sites_cover_every_mutation_kind():
    assert MANIFEST_BASES, "no golden manifest to mutate"
    for doc in SPEC_BASES:
        validate(doc)
    for doc in MANIFEST_BASES:
        assert validate_manifest(doc) == []
    kinds = {m[0] for _, m in SPEC_CASES}
    assert kinds >= {"wrong_type", "unknown_key", "missing_required", "out_of_range",
                     "non_finite", "bad_enum", "pattern"}, kinds
    kinds = {m[0] for _, m in MANIFEST_CASES}
    assert kinds >= {"wrong_type", "unknown_key", "missing_required", "out_of_range",
                     "bad_enum", "too_short"}, kinds


def test_every_spec_mutation_is_rejected_by_field():
    """Exhaustive over the base documents (a few thousand documents, ~1 s)."""
    bad = []
    for i, m in _exhaustive(SPEC_CASES):
        problem = spec_rejection(apply_mutation(SPEC_BASES[i], m), m)
        if problem:
            bad.append((m[0], dotted(m[1]), repr(m[2]), problem))
    assert not bad, f"{len(bad)} of {len(SPEC_CASES)}:\n" + "\n".join(map(str, sorted(set(bad))[:30]))


def test_every_manifest_mutation_is_rejected_by_pointer():
    bad = []
    for i, m in _exhaustive(MANIFEST_CASES):
        problem = manifest_rejection(apply_mutation(MANIFEST_BASES[i], m), m)
        if problem:
            bad.append((m[0], pointer(m[1]), repr(m[2]), problem))
    assert not bad, f"{len(bad)} of {len(MANIFEST_CASES)}:\n" + "\n".join(map(str, sorted(set(bad))[:30]))


# -- hypothesis: one random invalid document per example ------------------------------------

junk = st.one_of(
    st.text(max_size=8), st.integers(-(2**63), 2**63), st.floats(), st.booleans(), st.none(),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@st.composite
def invalid_docs(draw, bases, cases, schema):
    """A schema-derived mutation, optionally with the replacement value redrawn
    (any junk of a forbidden type, any number beyond the bound)."""
    i, (kind, path, arg) = draw(st.sampled_from(cases))
    doc = bases[i]
    if kind == "wrong_type":
        node_schema = next(s for p, s, _ in _walk(doc, schema, []) if tuple(p) == path)
        types = _types(node_schema)
        arg = draw(junk.filter(lambda v: not any(_matches_type(t, v) for t in types)))
    elif kind == "out_of_range" and isinstance(arg, int):
        # same side of the bound as the derived value, any distance
        base = next(v for p, _, v in _walk(doc, schema, []) if tuple(p) == path)
        arg = arg - draw(st.integers(0, 10**6)) if arg < base else arg + draw(st.integers(0, 10**6))
    elif kind == "unknown_key":
        known = set(node_at(doc, path[:-1]))
        key = draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in known))
        path = path[:-1] + (key,)
    return doc, (kind, path, arg)


def node_at(doc, path):
    for p in path:
        doc = doc[p]
    return doc


@FUZZ
@given(invalid_docs(SPEC_BASES, SPEC_CASES, SPEC_SCHEMA))
def test_random_invalid_spec_is_rejected_by_field(case):
    base, mutation = case
    doc = apply_mutation(base, mutation)
    problem = spec_rejection(doc, mutation)
    assert problem is None, (mutation, problem)


@FUZZ
@given(invalid_docs(MANIFEST_BASES, MANIFEST_CASES, MANIFEST_SCHEMA))
def test_random_invalid_manifest_is_rejected_by_pointer(case):
    base, mutation = case
    doc = apply_mutation(base, mutation)
    problem = manifest_rejection(doc, mutation)
    assert problem is None, (mutation, problem)


@FUZZ
@given(st.recursive(junk, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                    max_leaves=12))
def test_validators_never_crash_on_arbitrary_json(doc):
    try:
        validate(doc)
    except SpecError:
        pass
    assert isinstance(validate_manifest(doc), list)
