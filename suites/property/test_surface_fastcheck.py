"""The compiled surface check (harness.surfaces.fastcheck) never says "valid" where jsonschema
does not, and says it of every stored golden's surfaces.

Soundness is what the gate needs (a ``True`` skips ``jsonschema``): hypothesis draws a
stored surface document and applies a few random edits at random places (a value of
another JSON type, a float or bool for an int, a negative or NaN number, an empty or
odd string, a removed, added or renamed key, an array item more or less), then checks
``check(doc)`` implies no ``jsonschema`` error. It also draws arbitrary JSON values
against every subschema of every surface. Completeness is checked on the real data:
every surface of every stored golden passes the check.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.surfaces.fastcheck import _compile, compile_schema
from harness.surfaces.registry import SURFACES, schema_for

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted(REPO.glob("goldens/*/*/surfaces/*.json"))
FUZZ = settings(max_examples=max(300, settings().max_examples), deadline=None)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["", "x", "finished", "policy/rank00000", "rollout/rank1", "float32", "train/step1"]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["surface", "version", "workload", "sections", "phases", "coords", "collectives",
                         "operators", "outcome", "tp", "x", ""]), inner, max_size=5),
    max_leaves=12,
)


def _valid(schema: dict, doc) -> bool:
    return not any(True for _ in jsonschema.Draft202012Validator(schema).iter_errors(doc))


def _subschemas(schema):
    if isinstance(schema, dict):
        yield schema
        for key, value in schema.items():
            if key == "properties":
                for sub in value.values():
                    yield from _subschemas(sub)
            elif key in ("additionalProperties", "items", "propertyNames"):
                yield from _subschemas(value)
            elif key == "prefixItems":
                for sub in value:
                    yield from _subschemas(sub)


SUBSCHEMAS = [(name, i, sub) for name in SURFACES for i, sub in enumerate(_subschemas(schema_for(name)))]


def _sites(doc, path=()):
    """Every (path, value) in the document, the root included."""
    yield path, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _sites(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _sites(v, (*path, i))


def _replace(doc, path, value):
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


EDITS = ("type", "float", "bool", "negative", "nan", "empty", "odd_string", "drop_key", "add_key",
         "rename_key", "drop_item", "add_item")


def _applies(edit: str, value) -> bool:
    """Whether ``edit`` changes a value like ``value`` (``type`` and ``odd_string`` change any)."""
    if edit in ("float", "bool", "negative", "nan"):
        return type(value) in (int, float)
    if edit == "empty":
        return type(value) is str
    if edit in ("drop_key", "add_key", "rename_key"):
        return isinstance(value, dict)
    if edit in ("drop_item", "add_item"):
        return isinstance(value, list)
    return True


def _edit(doc, path, value, edit, data):
    if edit == "type":
        return _replace(doc, path, data.draw(JSON))
    if edit == "float" and type(value) is int:
        return _replace(doc, path, float(value))
    if edit == "bool" and type(value) is int:
        return _replace(doc, path, bool(value))
    if edit == "negative" and type(value) in (int, float):
        return _replace(doc, path, -1 - abs(value))
    if edit == "nan" and type(value) in (int, float):
        return _replace(doc, path, math.nan)
    if edit == "empty" and type(value) is str:
        return _replace(doc, path, "")
    if edit == "odd_string":
        return _replace(doc, path, data.draw(st.sampled_from(["policy/rank0", "rank00000", "x/rank00000", " "])))
    if edit == "drop_key" and isinstance(value, dict) and value:
        value.pop(data.draw(st.sampled_from(sorted(value))))
    elif edit == "rename_key" and isinstance(value, dict) and value:
        old = data.draw(st.sampled_from(sorted(value)))
        value[data.draw(st.sampled_from(["policy/rank0", "rank00000", "x/rank00000", "", "policy/rank00001"]))] = (
            value.pop(old))
    elif edit == "add_key" and isinstance(value, dict):
        value[data.draw(st.sampled_from(["zz", "tp", "outcome", "policy/rank00009", ""]))] = data.draw(JSON)
    elif edit == "drop_item" and isinstance(value, list) and value:
        value.pop(data.draw(st.integers(0, len(value) - 1)))
    elif edit == "add_item" and isinstance(value, list):
        value.append(data.draw(JSON))
    return doc


_LOADED: dict[Path, dict] = {}


def _load(path: Path) -> dict:
    if path not in _LOADED:
        _LOADED[path] = json.loads(path.read_text())
    return copy.deepcopy(_LOADED[path])


def test_every_stored_surface_passes_the_check():
    assert DOCS, "no stored surfaces found"
    for path in DOCS:
        name = path.stem
        check = compile_schema(schema_for(name))
        assert check is not None, f"{name}: the schema is not compiled (a keyword outside fastcheck.KEYWORDS)"
        assert check(json.loads(path.read_text())), f"{path}: valid for jsonschema, but the check says no"


@FUZZ
@given(st.data())
def test_edited_surfaces_pass_the_check_only_when_jsonschema_accepts_them(data):
    path = data.draw(st.sampled_from(DOCS))
    schema = schema_for(path.stem)
    check = compile_schema(schema)
    doc = _load(path)
    for _ in range(data.draw(st.integers(1, 3))):
        edit = data.draw(st.sampled_from(EDITS))
        sites = [(p, v) for p, v in _sites(doc) if _applies(edit, v)] or list(_sites(doc))
        # a depth first, then a site at it: the few shallow sites (the root, the sections, their
        # keys) are drawn as often as the thousands of entries deep in a big surface
        depths = sorted({len(p) for p, _ in sites})
        depth = depths[data.draw(st.integers(0, len(depths) - 1))]
        at_depth = [(p, v) for p, v in sites if len(p) == depth]
        site, value = at_depth[data.draw(st.integers(0, len(at_depth) - 1))]
        doc = _edit(doc, site, value, edit, data)
    if check(doc):
        assert _valid(schema, doc), f"{path.stem}: the check accepted a document jsonschema rejects"


@FUZZ
@given(st.sampled_from(SUBSCHEMAS), JSON)
def test_any_value_passes_a_subschema_check_only_when_jsonschema_accepts_it(entry, value):
    name, _, sub = entry
    if _compile(sub)(value):
        assert _valid(sub, value), f"{name}: {sub} accepted {value!r}"


@pytest.mark.parametrize("schema, doc, expected", [
    ({"type": "integer"}, 1, True),
    ({"type": "integer"}, 1.0, False),        # JSON Schema: an integer; here: ask jsonschema
    ({"type": "integer"}, True, False),
    ({"type": "number"}, math.nan, False),
    ({"const": 1}, True, False),              # jsonschema: True is not 1
    ({"enum": ["a", 1]}, 1, True),
    ({"type": "object", "propertyNames": {"pattern": "^a"}}, {"b": 1}, False),
    ({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}}, ["x", 1, 2], True),
    ({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}}, ["x", "y"], False),
    ({"type": ["string", "null"]}, None, True),
    ({"minimum": 0}, -1, False),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": False}, {"a": 1, "b": 2}, False),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, {"a": 1, "b": "x"}, False),
    ({"type": "object", "required": ["a"]}, {"b": 1}, False),
    ({"type": "string", "minLength": 1}, "", False),
    ({"type": "array", "minItems": 4, "maxItems": 4}, [1, 2, 3], False),
    ({"minimum": 0}, "not a number", True),   # minimum applies to numbers only
])
def test_small_cases(schema, doc, expected):
    assert _compile(schema)(doc) is expected
    if expected:
        assert _valid(schema, doc)


def test_unsupported_keywords_are_not_compiled():
    assert compile_schema({"type": "object", "oneOf": [{}]}) is None
    assert compile_schema({"$ref": "#/x"}) is None
    assert compile_schema({"const": [1]}) is None  # only scalar constants are compiled


SMALL_EDITS = {  # edit -> replacement for the value at a site (None: remove it)
    "string": lambda v: "zz", "empty": lambda v: "", "int": lambda v: 3, "negative": lambda v: -1,
    "float": lambda v: 2.5, "integral float": lambda v: 2.0, "bool": lambda v: True, "null": lambda v: None,
    "list": lambda v: [], "dict": lambda v: {}, "nan": lambda v: math.nan,
}
KEY_EDITS = ("zz", "", "policy/rank0", "rank00000", "x/rank00000")


# the smoke golden's smaller surfaces (jsonschema judges every edit the check accepts; the
# operators and rollouts surfaces, 20-30 KB, are left to the fuzz above)
SMALL = [p for p in sorted(REPO.glob("goldens/qwen3_moe_tiny_smoke/cpu/surfaces/*.json")) if p.stat().st_size < 8000]


@pytest.mark.parametrize("path", SMALL, ids=lambda p: p.stem)
def test_every_shallow_single_edit_of_a_small_golden_is_judged_soundly(path):
    """Exhaustive where the fuzz draws: every site down to depth 4 of the smoke golden's
    surfaces, each replaced by each kind of value, each dict key renamed, each dict and list
    emptied; the check's "valid" always agrees with jsonschema."""
    schema = schema_for(path.stem)
    check = compile_schema(schema)
    base = json.loads(path.read_text())
    cases = 0
    for site, value in list(_sites(base)):
        if len(site) > 4:
            continue
        edits = [lambda d, s=site, f=f: _replace(d, s, f(None)) for f in SMALL_EDITS.values()]
        if isinstance(value, dict):
            for key in value:
                for new in KEY_EDITS:
                    def rename(d, s=site, key=key, new=new):
                        parent = d
                        for k in s:
                            parent = parent[k]
                        parent[new] = parent.pop(key)
                        return d
                    edits.append(rename)
        for edit in edits:
            doc = edit(copy.deepcopy(base))
            cases += 1
            if check(doc):
                assert _valid(schema, doc), f"{path.stem}: accepted an edit at {site} jsonschema rejects"
    assert cases > 50
