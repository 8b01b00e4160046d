"""Values that would tie a golden to the machine it was captured on.

A golden is compared on other machines and in other checkouts (CI clones to a
different directory than a developer's box), so a gated value that holds an
absolute filesystem path, such as a run directory, a temp file or the checkout,
fails every check made anywhere else. Normalisation drops the keys it knows to
be volatile (``run_dir``, ``cwd``, ...); this module finds what is left, so the
store can refuse such a surface when a golden is written instead of the gate
failing later on a machine where nobody can tell why.

Contract
--------
``absolute_paths(doc)`` scans the *normalised* surface (what parity compares)
and returns ``(json_pointer, text)`` for every string value, and every object
key, that contains a POSIX absolute path of at least two components (``/a/b``),
depth first with keys sorted. A path counts where it starts the string or
follows a character that cannot end a name (white space, quotes, ``=``, ``(``,
``[``, ``,``); so metric names (``train/loss``), operator names
(``aten::add_``) and URLs (``file://x/y``) are not paths. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from harness.surfaces.canonical import json_pointer
from harness.surfaces.registry import normalise

__all__ = ["absolute_paths", "describe"]

# "/" + a name + "/" (+ more), at the start or after a separator; names are
# anything but separators and "/".
_PATH = re.compile(r"(?:^|(?<=[\s\"'=(\[,]))/[^/\s\"'=(\[\],]+/")


def _has_path(text: str) -> bool:
    return _PATH.search(text) is not None


def absolute_paths(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(pointer, text)`` of every absolute path left in ``normalise(doc)``."""
    found: list[tuple[str, str]] = []
    stack: list[tuple[tuple, Any]] = [((), normalise(doc))]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if _has_path(node):
                found.append((json_pointer(path), node))
        elif isinstance(node, dict):
            for key in sorted(node, reverse=True):
                if _has_path(str(key)):
                    found.append((json_pointer(path + (key,)), str(key)))
                stack.append((path + (key,), node[key]))
        elif isinstance(node, list):
            for index in range(len(node) - 1, -1, -1):
                stack.append((path + (index,), node[index]))
    return sorted(found)


def describe(name: str, found: list[tuple[str, str]]) -> str:
    """One message for a refused surface: the first offending pointer, the count and the fix."""
    pointer, text = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (f"surface {name}: {pointer or '/'}: {text!r} holds an absolute path{more}; a golden must not "
            "depend on where it was captured: leave the path out of the surface, or name its key in the "
            "surface's volatile_keys (harness/surfaces/registry.py)")
