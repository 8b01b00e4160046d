"""A fast yes-or-don't-know check of a document against a surface schema.

``jsonschema`` walks a surface one keyword at a time through generic machinery; a
collectives surface of a few thousand ``[op, group, dtype, numel]`` entries took about
0.2 s, and a ``pytest -m golden`` session validated 216 documents (every run's
surfaces and every golden's): 3.4 s of its driver, on the critical path.
:func:`compile_schema` turns a schema that uses only the keywords the surface schemas use
(:data:`KEYWORDS`) into plain Python closures that answer one question: is this document
*certainly* valid? ``True`` is only ever said of a document ``jsonschema`` accepts
too (``suites/property/test_surface_fastcheck.py`` holds it to ``jsonschema`` on generated
documents and on every stored golden); anything it is not sure of, it answers ``False``,
and the caller asks ``jsonschema``, which also words the errors. So a fast answer never
lets a bad document through; at worst it is slow, as before.

Where the two could differ, the check is stricter than JSON Schema: ``integer`` is a
Python ``int`` (not ``bool``, not a float like ``2.0``, which JSON Schema allows),
``number`` an ``int`` or a finite ``float``, ``const`` / ``enum`` match values of the same
type only (JSON Schema's ``1 == 1.0``), and a ``pattern`` is searched with ``re.search``, as
``jsonschema`` does. A schema with any other keyword (``$ref``, ``oneOf``, formats, ...)
is not compiled (``None``): every document then goes to ``jsonschema``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

ANNOTATIONS = frozenset({"$schema", "$id", "title", "description"})
KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "propertyNames", "items",
                      "prefixItems", "minItems", "maxItems", "const", "enum", "minLength", "pattern",
                      "minimum"}) | ANNOTATIONS


class Unsupported(ValueError):
    """The schema uses a keyword (or form) this module does not compile."""


def compile_schema(schema: Any) -> Check | None:
    """A check for ``schema``, or None when it uses something outside :data:`KEYWORDS`."""
    try:
        return _compile(schema)
    except Unsupported:
        return None


def _is_integer(x: Any) -> bool:
    return type(x) is int


def _is_number(x: Any) -> bool:
    return type(x) is int or (type(x) is float and math.isfinite(x))


_TYPES: dict[str, Check] = {
    "object": lambda x: type(x) is dict,
    "array": lambda x: type(x) is list,
    "string": lambda x: type(x) is str,
    "integer": _is_integer,
    "number": _is_number,
    "boolean": lambda x: type(x) is bool,
    "null": lambda x: x is None,
}


def _same(value: Any) -> Check:
    """Equal to ``value`` with the same type (scalars only; anything else is not compiled)."""
    if type(value) not in (str, int, bool, type(None)):
        raise Unsupported(f"const/enum value {value!r}")
    kind = type(value)
    return lambda x: type(x) is kind and x == value


def _compile(schema: Any) -> Check:
    if schema is True:
        return lambda x: True
    if schema is False or type(schema) is not dict:
        raise Unsupported(f"schema {schema!r}")
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise Unsupported(f"keywords {sorted(unknown)}")
    checks: list[Check] = []
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not kinds or any(not isinstance(k, str) or k not in _TYPES for k in kinds):
            raise Unsupported(f"type {schema['type']!r}")
        if len(kinds) == 1:
            checks.append(_TYPES[kinds[0]])
        else:
            alternatives = [_TYPES[k] for k in kinds]
            checks.append(lambda x: any(a(x) for a in alternatives))
    if "const" in schema:
        checks.append(_same(schema["const"]))
    if "enum" in schema:
        options = [_same(v) for v in schema["enum"]]
        checks.append(lambda x: any(o(x) for o in options))
    if "minLength" in schema:
        n = schema["minLength"]
        checks.append(lambda x: type(x) is not str or len(x) >= n)
    if "pattern" in schema:
        search = re.compile(schema["pattern"]).search
        checks.append(lambda x: type(x) is not str or search(x) is not None)
    if "minimum" in schema:
        low = schema["minimum"]
        if not _is_number(low):
            raise Unsupported(f"minimum {low!r}")
        checks.append(lambda x: not _is_number(x) or x >= low)
    checks.extend(_object_checks(schema))
    checks.extend(_array_checks(schema))
    if not checks:
        return lambda x: True
    if len(checks) == 1:
        return checks[0]
    return lambda x: all(c(x) for c in checks)


def _object_checks(schema: dict) -> list[Check]:
    keys = ("properties", "required", "additionalProperties", "propertyNames")
    if not any(k in schema for k in keys):
        return []
    props = {k: _compile(v) for k, v in (schema.get("properties") or {}).items()}
    required = tuple(schema.get("required") or ())
    extra = schema.get("additionalProperties", True)
    extra_check = None if extra is True else (lambda x: False) if extra is False else _compile(extra)
    names = _compile(schema["propertyNames"]) if "propertyNames" in schema else None

    def check(x: Any) -> bool:
        if type(x) is not dict:
            return True  # the keywords apply to objects only ("type" says whether it must be one)
        for key in required:
            if key not in x:
                return False
        for key, value in x.items():
            if type(key) is not str:
                return False
            if names is not None and not names(key):
                return False
            prop = props.get(key)
            if prop is not None:
                if not prop(value):
                    return False
            elif extra_check is not None and not extra_check(value):
                return False
        return True

    return [check]


def _array_checks(schema: dict) -> list[Check]:
    keys = ("items", "prefixItems", "minItems", "maxItems")
    if not any(k in schema for k in keys):
        return []
    prefix = [_compile(s) for s in schema.get("prefixItems") or ()]
    rest = _compile(schema["items"]) if "items" in schema else None
    low = schema.get("minItems", 0)
    high = schema.get("maxItems")

    def check(x: Any) -> bool:
        if type(x) is not list:
            return True
        n = len(x)
        if n < low or (high is not None and n > high):
            return False
        for i, item in enumerate(x):
            if i < len(prefix):
                if not prefix[i](item):
                    return False
            elif rest is not None and not rest(item):
                return False
        return True

    return [check]
