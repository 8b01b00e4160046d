"""The workload JSON Schema: validation with field-path errors, default filling.

Contracts:
- ``validate(doc)`` raises ``SpecError`` for the *first* problem in document
  order; the error's ``field`` is the dotted path of the offending key (for an
  unknown key, the unknown key itself; for a missing one, the missing key).
- Integers are strict: ``2.0`` and ``true`` are not integers.
- ``fill_defaults(doc)`` returns a new dict in which every field the schema
  gives a default is present, and every ``number`` field holds a ``float``
  (so ``lr: 1`` and ``lr: 1.0`` give the same spec and the same digest).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from functools import lru_cache
from importlib import resources
from typing import Any

from harness.registry.schema import SCHEMA_ENUMS
from harness.spec.errors import SpecError

SCHEMA_FILE = "workload.schema.json"


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The packaged schema (read once), its name enums generated from the registries
    (``harness.registry.schema.SCHEMA_ENUMS``: ``policy.backend``, ``rollout.backend``, ``grpo.trainer``,
    ``rollout.refit.transport``). The file keeps a copy of each for readers of the file;
    ``suites/unit/test_registries.py`` fails when the copy and the registry drift apart."""
    text = resources.files("harness.spec").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    schema = json.loads(text)
    for path, names in SCHEMA_ENUMS.items():
        node = schema
        for key in path:
            node = node["properties"][key]
        node["enum"] = list(names)
    return schema


@lru_cache(maxsize=1)
def _validator() -> Any:
    # jsonschema is imported lazily: `golden --help` must not pay for it.
    from jsonschema import Draft202012Validator, validators

    def is_strict_int(_checker: Any, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", is_strict_int)
    strict_cls = validators.extend(Draft202012Validator, type_checker=checker)
    schema = load_schema()
    Draft202012Validator.check_schema(schema)
    return strict_cls(schema)


def _join(path: Iterator[Any] | list[Any]) -> str:
    parts = [str(p) for p in path]
    return ".".join(parts) if parts else "(root)"


def _describe(value: Any) -> str:
    kind = "null" if value is None else type(value).__name__
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kind} {text}"


def _to_spec_error(error: Any) -> SpecError:
    """Turn one jsonschema ``ValidationError`` into a ``SpecError`` with a
    precise field path and a message a user can act on."""
    path = list(error.absolute_path)
    kind = error.validator
    value = error.instance
    if kind == "additionalProperties" and isinstance(value, dict):
        known = sorted(error.schema.get("properties", {}))
        extra = sorted(k for k in value if k not in known)
        return SpecError(_join(path + [extra[0]]), f"unknown key (known keys here: {', '.join(known)})")
    if kind == "required" and isinstance(value, dict):
        missing = [k for k in error.validator_value if k not in value]
        return SpecError(_join(path + [missing[0]]), "required field is missing")
    field = _join(path)
    if kind == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        return SpecError(field, f"expected {expected}, got {_describe(value)}")
    if kind == "enum":
        return SpecError(field, f"must be one of {error.validator_value}, got {_describe(value)}")
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[kind]
        return SpecError(field, f"must be {op} {error.validator_value}, got {value!r}")
    if kind == "pattern":
        return SpecError(field, f"{value!r} does not match the pattern {error.validator_value!r}")
    if kind in ("minItems", "maxItems"):
        return SpecError(field, f"wrong number of items ({kind} {error.validator_value}), got {len(value)}")
    if kind == "uniqueItems":
        return SpecError(field, f"items must be unique, got {value!r}")
    if kind == "oneOf" and field.endswith("pp_layout"):
        return SpecError(
            field, f"must be null or [first_stage_layers, last_stage_layers] (two ints >= 1), got {value!r}"
        )
    return SpecError(field, error.message)


def _non_finite(value: Any, path: list[str]) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return _join(path)
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, sub in items:
        found = _non_finite(sub, path + [str(key)])
        if found:
            return found
    return None


def validate(doc: Any) -> None:
    """Raise ``SpecError`` for the first schema violation in ``doc``
    (NaN and infinities are refused everywhere: specs are digested as JSON)."""
    if not isinstance(doc, dict):
        raise SpecError("(root)", f"a workload spec must be a mapping, got {_describe(doc)}")
    errors = list(_validator().iter_errors(doc))
    if not errors:
        bad = _non_finite(doc, [])
        if bad:
            raise SpecError(bad, "must be a finite number (NaN and infinity are refused)")
        return
    # Deterministic choice: the shallowest, then lexically first path. A
    # oneOf failure reports the container, which is what a user edits.
    errors.sort(key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path], e.validator))
    raise _to_spec_error(errors[0])


def _fill(node: dict[str, Any], value: Any) -> Any:
    types = node.get("type")
    types = types if isinstance(types, list) else [types]
    if "number" in types and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if "object" not in types or not isinstance(value, dict):
        return value
    props = node.get("properties", {})
    out: dict[str, Any] = {}
    for key, sub in props.items():
        if key in value:
            out[key] = _fill(sub, value[key])
        elif "default" in sub:
            out[key] = _fill(sub, copy.deepcopy(sub["default"]))
    for key in value:  # unknown keys survive so validate() can name them
        if key not in out:
            out[key] = value[key]
    return out


def fill_defaults(doc: dict[str, Any]) -> dict[str, Any]:
    """A new dict with every schema default filled in (input not modified)."""
    return _fill(load_schema(), doc)


def defaults_tree(node: dict[str, Any] | None = None, prefix: str = "") -> dict[str, Any]:
    """Flat ``{dotted.path: default}`` for every leaf default (for docs/tests) of
    the blocks a loaded spec always has: an optional block with no default of its
    own (``policy.lora``) is absent unless written, so its leaves are left out."""
    node = node if node is not None else load_schema()
    out: dict[str, Any] = {}
    required = set(node.get("required", ()))
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        if sub.get("type") == "object":
            if "default" in sub or key in required:
                out.update(defaults_tree(sub, path + "."))
        elif "default" in sub:
            out[path] = sub["default"]
    return out


def section_defaults(section: str) -> dict[str, Any]:
    """The defaults of one spec block as a dict, e.g. ``section_defaults("grpo.loss")``."""
    prefix = section + "."
    return {k[len(prefix):]: v for k, v in defaults_tree().items()
            if k.startswith(prefix) and "." not in k[len(prefix):]}
