"""Canonical JSON: the one byte form that digests, goldens and sha256s are taken over.

Contract
--------
* ``canonical_bytes(doc)`` is UTF-8 JSON with keys sorted, separators ``,`` and
  ``:`` (no whitespace), non-ASCII kept as is, floats in ``repr`` form (the
  shortest string that round-trips to the same double). Two documents have equal
  canonical bytes iff they are equal as JSON values *including* the int/float
  distinction (``1`` and ``1.0`` differ) and bool vs int (``true`` and ``1`` differ).
* NaN and +-inf have no JSON spelling; they are refused with the JSON pointer of
  the first offending value (``NonFiniteError``), never written as ``NaN``.
* ``loads_strict`` / ``load_strict`` parse JSON but refuse the ``NaN``,
  ``Infinity`` and ``-Infinity`` tokens that Python's ``json`` accepts by default,
  again naming the pointer of the value. Duplicate object keys are refused too
  (a later key would silently win otherwise).

Only the standard library is used: this module sits at the bottom of the gate half.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "NonFiniteError",
    "StrictJSONError",
    "canonical_bytes",
    "surface_file_bytes",
    "INT_MAX",
    "INT_MIN",
    "domain_problem",
    "out_of_range_message",
    "find_non_finite",
    "find_out_of_domain",
    "json_pointer",
    "loads_strict",
    "load_strict",
]


class NonFiniteError(ValueError):
    """A NaN or infinite float where JSON has no spelling for it."""

    def __init__(self, pointer: str, value: Any):
        self.pointer = pointer
        self.value = value
        super().__init__(f"non-finite number {value!r} at {pointer or '/'} (NaN/inf are refused)")


class StrictJSONError(ValueError):
    """Input is not strict JSON: a syntax error, a NaN/Infinity token or a duplicate key."""

    def __init__(self, message: str, pointer: str = "", source: str = ""):
        self.pointer = pointer
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{message}")


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def json_pointer(parts: tuple[Any, ...] | list[Any]) -> str:
    """RFC 6901 pointer for a path of keys/indices (``()`` is the empty pointer ``""``)."""
    return "".join("/" + _escape(str(p)) for p in parts)


def _first_leaf(value: Any, bad: Callable[[Any], bool], path: tuple = ()) -> tuple[tuple, Any] | None:
    """Path and value of the first leaf (not a dict, list or tuple) for which ``bad`` holds, depth
    first with dict keys sorted; None when there is none."""
    stack: list[tuple[tuple, Any]] = [(path, value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            for key in sorted(node, reverse=True):
                stack.append((path + (key,), node[key]))
        elif isinstance(node, (list, tuple)):
            for index in range(len(node) - 1, -1, -1):
                stack.append((path + (index,), node[index]))
        elif bad(node):
            return path, node
    return None


def _non_finite(node: Any) -> bool:
    return isinstance(node, float) and not math.isfinite(node)


def find_non_finite(value: Any, _path: tuple = ()) -> tuple[tuple, float] | None:
    """Path and value of the first NaN/inf float in ``value`` (depth first, keys sorted), or None."""
    return _first_leaf(value, _non_finite, _path)


# The gate's numeric domain (issue 41), the same for every document it reads or validates
# (manifests, surfaces, provenance, run.json): integers within 64 bits, finite floats.
# Anything else is refused before it reaches a comparison that could not compare it.
INT_MIN, INT_MAX = -(2 ** 63), 2 ** 63 - 1


def find_out_of_domain(value: Any, _path: tuple = ()) -> tuple[tuple, Any] | None:
    """Path and value of the first number outside the gate's domain (an int outside
    ``INT_MIN..INT_MAX``, a NaN/inf float; depth first, keys sorted), or None."""
    return _first_leaf(value, lambda node: _non_finite(node) or (
        isinstance(node, int) and not isinstance(node, bool) and not INT_MIN <= node <= INT_MAX), _path)


def domain_problem(value: Any) -> tuple[str, str] | None:
    """``(json_pointer, message)`` of the first number outside the domain, or None (a walk of
    the value: about as fast as serialising it, whatever its strings hold)."""
    found = find_out_of_domain(value)
    if found is None:
        return None
    path, number = found
    if isinstance(number, float):
        return json_pointer(path), f"non-finite number {number!r} (NaN/inf are refused)"
    return json_pointer(path), out_of_range_message(number)


def out_of_range_message(number: int | str) -> str:
    """Why an integer (or its JSON token) outside the domain is refused."""
    digits = len(str(number).lstrip("-")) if isinstance(number, str) or abs(number) < 10 ** 4000 else "over 4000"
    return f"integer of {digits} digits is outside the 64-bit range (-2**63 .. 2**63-1) the gate compares"


def canonical_bytes(doc: Any) -> bytes:
    """The canonical UTF-8 bytes of ``doc`` (see module contract). Raises NonFiniteError."""
    try:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        found = find_non_finite(doc)
        if found is None:
            raise
        path, value = found
        raise NonFiniteError(json_pointer(path), value) from exc
    return text.encode("utf-8")


def surface_file_bytes(doc: Any) -> bytes:
    """Bytes of a stored surface/manifest file: canonical form plus one trailing newline."""
    return canonical_bytes(doc) + b"\n"


class _NonFiniteToken:
    """Placeholder for a NaN/Infinity token; located after parsing to report its pointer."""

    __slots__ = ("token",)

    def __init__(self, token: str):
        self.token = token


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise StrictJSONError(f"duplicate object key {key!r}")
        out[key] = value
    return out


def _find_placeholder(value: Any) -> tuple[tuple, str] | None:
    stack: list[tuple[tuple, Any]] = [((), value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, _NonFiniteToken):
            return path, node.token
        if isinstance(node, dict):
            for key in sorted(node, reverse=True):
                stack.append((path + (key,), node[key]))
        elif isinstance(node, list):
            for index in range(len(node) - 1, -1, -1):
                stack.append((path + (index,), node[index]))
    return None


def loads_strict(text: str | bytes, *, source: str = "") -> Any:
    """Parse strict JSON. Raises StrictJSONError with ``pointer`` set for NaN/Infinity tokens."""
    saw_constant = False

    def on_constant(token: str) -> _NonFiniteToken:
        nonlocal saw_constant
        saw_constant = True
        return _NonFiniteToken(token)

    try:
        value = json.loads(text, parse_constant=on_constant, object_pairs_hook=_reject_duplicates)
    except StrictJSONError as exc:
        raise StrictJSONError(str(exc), source=source) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StrictJSONError(f"not valid JSON: {exc}", source=source) from None
    if saw_constant:
        path, token = _find_placeholder(value)  # type: ignore[misc]
        pointer = json_pointer(path)
        raise StrictJSONError(f"non-finite token {token} at {pointer or '/'} (NaN/Infinity are refused)",
                              pointer=pointer, source=source)
    return value


def load_strict(path: str | Path) -> Any:
    """``loads_strict`` of a file's bytes; the file path is named in every error."""
    path = Path(path)
    return loads_strict(path.read_bytes(), source=str(path))
