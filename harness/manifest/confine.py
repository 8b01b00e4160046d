"""Path confinement: a path a manifest lists must name a file inside its run directory.

``path_problem(rel)`` says what is wrong with the *spelling* of a listed path
(absolute, a ``..`` segment, a backslash, empty); ``confined(base, rel)`` also
resolves it (symlinks followed) and refuses a target outside ``base`` or one that
is not a regular file. Nothing outside ``base`` is ever opened: callers resolve
through ``confined`` first and open only what it returns.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

__all__ = ["PathEscape", "path_problem", "confined"]


class PathEscape(ValueError):
    """A listed path that is badly spelled, leaves its base directory, or is not a regular file."""


def path_problem(path: str) -> str | None:
    """What is wrong with the spelling of a listed path, or None."""
    if not isinstance(path, str):
        return f"path must be a string, got {type(path).__name__}"
    if path in ("", "."):
        return "path is empty"
    if "\\" in path:
        return f"path {path[:200]!r} contains a backslash; use POSIX '/' separators"
    if "\x00" in path:
        return "path contains a NUL character"
    pure = PurePosixPath(path)
    if pure.is_absolute():
        return f"path {path[:200]!r} is absolute; paths must be relative to the manifest's directory"
    if ".." in pure.parts:
        return f"path {path[:200]!r} contains a '..' segment; paths must stay inside the manifest's directory"
    return None


def confined(base: str | Path, rel: str, *, must_exist: bool = True) -> Path:
    """The resolved path of ``rel`` under ``base``; raises PathEscape (message says why)."""
    problem = path_problem(rel)
    if problem:
        raise PathEscape(problem)
    root = Path(base).resolve()
    try:
        target = (root / rel).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise PathEscape(f"path {rel[:200]!r} does not resolve: {exc}") from None
    if not target.is_relative_to(root):
        raise PathEscape(f"path {rel[:200]!r} resolves outside {base} (via a symlink)")
    if must_exist:
        try:
            mode = os.stat(target).st_mode
        except OSError:
            raise PathEscape(f"file {rel[:200]!r} is missing under {base}") from None
        if not stat.S_ISREG(mode):
            raise PathEscape(f"{rel[:200]!r} under {base} is not a regular file")
    return target
