"""``key.path=value`` overrides, as typed on the command line.

Contract: ``apply_overrides`` never mutates its input; values are parsed as
YAML (so ``policy.tp=4`` is an int and ``plugins.policy_profiler=null`` is
``None``); missing intermediate mappings are created, and whether the final
key exists is left to schema validation (which names unknown keys).
Overrides apply in order; a later one wins.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

from harness.spec.errors import SpecError
from harness.spec.yaml_io import parse_scalar

_KEY_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into (``["a", "b", "c"]``, typed value)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SpecError("overrides", f"expected key.path=value, got {text!r}")
    parts = key.split(".")
    for part in parts:
        if not _KEY_PART.match(part):
            raise SpecError(key, f"override key {key!r} is not a dotted path of identifiers")
    try:
        value = parse_scalar(raw)
    except SpecError as exc:
        raise SpecError(key, f"override value {raw!r} is not valid YAML ({exc.message})") from None
    return parts, value


def apply_overrides(spec: dict[str, Any], overrides: Iterable[str] = ()) -> dict[str, Any]:
    """Return a copy of ``spec`` with every ``key.path=value`` applied."""
    out = copy.deepcopy(spec)
    for text in overrides:
        parts, value = parse_override(text)
        node: Any = out
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                prefix = ".".join(parts[: depth + 1])
                raise SpecError(".".join(parts), f"cannot set a key inside {prefix}, which holds {child!r}")
            node = child
        node[parts[-1]] = value
    return out
