"""Strict YAML reading for specs and ``key=value`` overrides.

Differences from ``yaml.safe_load`` (both make mistakes loud instead of silent):
- a key repeated in one mapping is an error (PyYAML keeps the last one);
- ``1e-3`` / ``1e6`` are floats, as in YAML 1.2 and JSON (PyYAML's YAML 1.1
  resolver reads them as strings, which would fail type checks far from
  where the number was written).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from harness.spec.errors import SpecError


class StrictLoader(yaml.SafeLoader):
    """SafeLoader + duplicate-key rejection + YAML 1.2 exponent floats."""


StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_text(text: str, *, source: str) -> Any:
    """Parse YAML text; syntax errors become ``SpecError`` naming ``source``
    and the line."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(root)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(where, f"invalid YAML: {problem}", source=source) from None


def load_yaml_file(path: Path) -> Any:
    """Read and parse one YAML file (``SpecError`` when unreadable)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError("(file)", f"cannot read: {exc.strerror or exc}", source=str(path)) from None
    return load_yaml_text(text, source=str(path))


def parse_scalar(text: str) -> Any:
    """A command-line value typed the way YAML types it (``4`` -> int,
    ``null`` -> None, ``[23, 23]`` -> list, ``1e-3`` -> float)."""
    if text.strip() == "":
        return ""
    return load_yaml_text(text, source="override")
