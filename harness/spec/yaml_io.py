"""Strict YAML reading for specs and ``key=value`` overrides.

Differences from ``yaml.safe_load`` (both make mistakes loud instead of silent):
- a key repeated in one mapping is an error (PyYAML keeps the last one);
- ``1e-3`` / ``1e6`` are floats, as in YAML 1.2 and JSON (PyYAML's YAML 1.1
  resolver reads them as strings, which would fail type checks far from
  where the number was written);
- bounded: a file larger than ``max_bytes`` is refused from its size, before
  it is read, and a document whose aliases expand to more than ``max_nodes``
  nodes (a "billion laughs" alias bomb: a few lines that stand for billions of
  values once anything walks them) is refused after composing, before any
  value is constructed. Nesting deeper than the parser can follow is refused
  too. Both limits are far above any real spec or tolerance file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from harness.spec.errors import SpecError


def _env_limit(name: str, default: int) -> tuple[int, str | None]:
    """(limit, problem) from ``$name``: a value that is not an integer >= 1 is a problem
    every read then reports (SpecError naming the variable), never an import-time crash."""
    raw = os.environ.get(name)
    if raw is None:
        return default, None
    try:
        value = int(raw)
    except ValueError:
        return default, f"${name}={raw[:40]!r} is not an integer"
    return (value, None) if value >= 1 else (default, f"${name} must be >= 1, got {value}")


MAX_YAML_BYTES, _BYTES_PROBLEM = _env_limit("GOLDEN_YAML_MAX_BYTES", 4 * 1024 * 1024)
MAX_YAML_NODES, _NODES_PROBLEM = _env_limit("GOLDEN_YAML_MAX_NODES", 1_000_000)


def _check_environment(source: str) -> None:
    problem = _BYTES_PROBLEM or _NODES_PROBLEM
    if problem:
        raise SpecError("(environment)", problem, source=source)


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


def expanded_size(root: yaml.Node, limit: int) -> int:
    """Node count of ``root`` with every alias expanded (a shared node counts
    once per reference), computed without expanding anything: sizes are
    memoised per node, so the cost is linear in the composed graph. Returns
    early with a value above ``limit`` once the count passes it."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1
            continue
        children = [item for pair in node.value for item in pair] if isinstance(node, yaml.MappingNode) else node.value
        if not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        total = 1 + sum(sizes[id(child)] for child in children)
        if total > limit:
            return total
        sizes[id(node)] = total
    return sizes[id(root)]


def load_yaml_text(text: str, *, source: str, max_nodes: int | None = None) -> Any:
    """Parse YAML text; syntax errors, nesting too deep for the parser and
    alias expansion over ``max_nodes`` (default ``MAX_YAML_NODES``) become
    ``SpecError`` naming ``source`` and the line."""
    _check_environment(source)
    limit = MAX_YAML_NODES if max_nodes is None else max_nodes
    loader: StrictLoader | None = None
    try:
        loader = StrictLoader(text)  # the reader refuses non-printable characters here
        node = loader.get_single_node()
        if node is None:
            return None
        size = expanded_size(node, limit)
        if size > limit:
            raise SpecError("(root)", f"document expands to more than {limit} nodes through its aliases "
                            f"(anchors '&' and aliases '*'); refused before building any value", source=source)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(root)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(where, f"invalid YAML: {problem}", source=source) from None
    except RecursionError:
        raise SpecError("(root)", "nesting too deep to parse", source=source) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml_text(path: Path, *, max_bytes: int | None = None) -> str:
    """The text of one YAML file, refused from its size when it is larger
    than ``max_bytes`` (default ``MAX_YAML_BYTES``); never reads more than
    the limit. ``SpecError`` when unreadable, too large or not UTF-8."""
    _check_environment(str(path))
    limit = MAX_YAML_BYTES if max_bytes is None else max_bytes
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limit:
                raise SpecError("(file)", f"{size} bytes is more than the {limit}-byte limit for a YAML file "
                                f"(GOLDEN_YAML_MAX_BYTES)", source=str(path))
            data = handle.read(limit + 1)
    except OSError as exc:
        raise SpecError("(file)", f"cannot read: {exc.strerror or exc}", source=str(path)) from None
    if len(data) > limit:
        raise SpecError("(file)", f"grew past the {limit}-byte limit while being read", source=str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError("(file)", f"not UTF-8 (byte {exc.start})", source=str(path)) from None


def load_yaml_file(path: Path) -> Any:
    """Read (bounded) and parse one YAML file (``SpecError`` when unreadable)."""
    return load_yaml_text(read_yaml_text(path), source=str(path))


def parse_scalar(text: str) -> Any:
    """A command-line value typed the way YAML types it (``4`` -> int,
    ``null`` -> None, ``[23, 23]`` -> list, ``1e-3`` -> float)."""
    if text.strip() == "":
        return ""
    return load_yaml_text(text, source="override")
