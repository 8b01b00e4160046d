"""Where a repository's goldens live: one resolver for the ``golden`` command and the pytest plugin.

A consumer repository keeps its own goldens folder (``<root>/<workload>/workload.yaml``
plus ``<root>/<workload>/<platform>/``) and names it in one of these ways, the first
that applies wins:

1. ``--goldens-root DIR`` (the same spelling in the CLI and in pytest), relative to the cwd;
2. ``$GOLDEN_ROOT``, relative to the cwd;
3. a ``[tool.golden]`` table in the nearest ``pyproject.toml`` that has one, found by
   walking up from the start directory (the cwd; pytest also tries its rootdir)::

       [tool.golden]
       goldens-root = "goldens"                   # relative to that pyproject.toml
       workloads = ["qwen3_moe_tiny_smoke"]       # optional: what pytest schedules

4. in a source checkout of the harness itself, the checkout's ``goldens/``;
5. ``./goldens`` (which a fail-closed caller reports as missing when it does not exist).

``workloads`` names workloads to schedule even when the root has no spec for them:
a name without ``<root>/<name>/workload.yaml`` is a built-in workload (its spec is
package data, ``harness.spec.load.BUILTIN_WORKLOADS``).

Errors in a ``[tool.golden]`` table (unknown key, wrong type, unreadable TOML) are
``SpecError``s naming the key and the file. Stdlib only (gate half).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.spec.errors import SpecError

GOLDEN_ROOT_ENV = "GOLDEN_ROOT"
PYPROJECT = "pyproject.toml"
TABLE_KEYS = ("goldens-root", "workloads")
_CHECKOUT = Path(__file__).resolve().parents[2]  # the folder above the package


@dataclass(frozen=True)
class GoldensConfig:
    """The resolved goldens root and where it came from (for messages)."""

    root: Path
    source: str  # "--goldens-root", "$GOLDEN_ROOT", "<file> [tool.golden]", "the harness checkout", "default"
    workloads: tuple[str, ...] | None = None  # [tool.golden] workloads, None when not given
    pyproject: Path | None = None

    @property
    def explicit(self) -> bool:
        """True when the user named the root (option, env or pyproject), not a fallback."""
        return self.source not in ("the harness checkout", "default")


def _checkout_goldens() -> Path | None:
    """The harness checkout's goldens/, when the package runs from a source checkout
    (an editable install or the repository itself), never from an installed wheel."""
    pyproject = _CHECKOUT / PYPROJECT
    goldens = _CHECKOUT / "goldens"
    if not (goldens.is_dir() and pyproject.is_file()):
        return None
    try:
        name = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("name")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return goldens if name == "grpo-golden-harness" else None


def find_tool_table(start: Path) -> tuple[Path, dict] | None:
    """The nearest ``pyproject.toml`` at or above ``start`` with a ``[tool.golden]`` table."""
    for folder in (start.resolve(), *start.resolve().parents):
        candidate = folder / PYPROJECT
        if not candidate.is_file():
            continue
        try:
            doc = tomllib.loads(candidate.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise SpecError("(toml)", f"not valid TOML: {exc}").with_source(str(candidate)) from None
        except OSError as exc:
            raise SpecError("(file)", f"cannot read: {exc.strerror or exc}").with_source(str(candidate)) from None
        table = doc.get("tool", {}).get("golden")
        if table is not None:
            return candidate, table
    return None


def _parse_table(path: Path, table: object) -> tuple[Path | None, tuple[str, ...] | None]:
    def bad(key: str, why: str) -> SpecError:
        return SpecError(f"tool.golden.{key}" if key else "tool.golden", why).with_source(str(path))

    if not isinstance(table, dict):
        raise bad("", f"must be a table, got {type(table).__name__}")
    unknown = sorted(set(table) - set(TABLE_KEYS))
    if unknown:
        raise bad(unknown[0], f"unknown key (known: {', '.join(TABLE_KEYS)})")
    root = table.get("goldens-root")
    if root is not None and (not isinstance(root, str) or not root.strip()):
        raise bad("goldens-root", f"must be a non-empty string (a folder relative to {path.name}), got {root!r}")
    workloads = table.get("workloads")
    if workloads is not None and (not isinstance(workloads, list) or not workloads
                                  or not all(isinstance(w, str) and w.strip() for w in workloads)):
        raise bad("workloads", f"must be a non-empty list of workload names, got {workloads!r}")
    return (path.parent / root if root else None), (tuple(workloads) if workloads else None)


def goldens_config(explicit: str | Path | None = None, start: Path | None = None,
                   also_start: Path | None = None, explicit_source: str = "--goldens-root") -> GoldensConfig:
    """Resolve the goldens root (see the module docstring for the order).

    ``start`` (default: the cwd) is where the ``pyproject.toml`` walk begins;
    ``also_start`` is tried when nothing is found from ``start`` (pytest's rootdir);
    ``explicit_source`` names where ``explicit`` came from, for messages.
    ``[tool.golden] workloads`` is read even when the root itself comes from an
    option or the environment."""
    found = None
    for where in (start or Path.cwd(), also_start):
        if where is not None:
            found = find_tool_table(Path(where))
            if found is not None:
                break
    table_root, workloads, pyproject = None, None, None
    if found is not None:
        pyproject = found[0]
        table_root, workloads = _parse_table(*found)
    if explicit:
        return GoldensConfig(Path(explicit), explicit_source, workloads, pyproject)
    env = os.environ.get(GOLDEN_ROOT_ENV)
    if env:
        return GoldensConfig(Path(env), f"${GOLDEN_ROOT_ENV}", workloads, pyproject)
    if table_root is not None:
        return GoldensConfig(table_root, f"{pyproject} [tool.golden] goldens-root", workloads, pyproject)
    checkout = _checkout_goldens()
    if checkout is not None:
        return GoldensConfig(checkout, "the harness checkout", workloads, pyproject)
    return GoldensConfig(Path.cwd() / "goldens", "default", workloads, pyproject)


def resolve_goldens_root(explicit: str | Path | None = None, start: Path | None = None) -> Path:
    """Just the folder of :func:`goldens_config`."""
    return goldens_config(explicit, start).root


HOW_TO_NAME_A_ROOT = (f"give --goldens-root DIR, set ${GOLDEN_ROOT_ENV}, or add a [tool.golden] table with "
                      f"goldens-root = \"DIR\" to the repository's {PYPROJECT}")
