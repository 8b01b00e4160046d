"""Merge a run's per-process records (``RUN_DIR/footprint/*.paths``) into ``footprint.json``.

Contract (gate half: stdlib only, no torch, no ray):

``merge_run(run_dir)`` reads every record the recorder wrote and returns the footprint
document (``schema.FORMAT``), or None when the run has no record (recording off):

* ``files``: every file inside the checkout, repository-relative, sorted: the harness's
  source checkout (``package_root().parent`` when it is a git work tree), else the git work
  tree of the working directory (a consumer's repository; the installed harness is then a
  distribution like any other); a ``__pycache__/*.pyc`` counts as its source
  ``.py``. ``dirs``: the directories inside those roots that a process listed (the import
  system lists every package folder it searches): a file added to or removed from one of them
  can change what that process imports or globs.
* ``distributions``: ``name -> version`` of the installed distribution that owns each
  third-party file read (``site-packages`` / ``dist-packages``), resolved in the
  ``site-packages`` folder the file is in; ``unresolved``: files there no distribution owns.
* ``python``: the interpreter versions of the processes (one, normally).
* ``external``: how many other paths were read (the standard library is covered by
  ``python``; ``/proc``, ``/dev``, the run directory, temporary files are not the code).

``write_footprint(run_dir)`` writes the document to ``RUN_DIR/footprint.json`` (canonical
JSON) and returns it.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path

from harness.footprint.schema import FORMAT, RUN_FILE

__all__ = ["merge_run", "write_footprint"]

_PYC = re.compile(r"^(?P<dir>.*)/__pycache__/(?P<name>[^/.]+)\.[^/]+\.pyc$")
_METADATA = re.compile(r"^[^/]+\.(?:dist|egg)-info(?:/|$)")
_SITE = re.compile(r"^(?P<site>.*/(?:site|dist)-packages)/(?P<rel>.+)$")


def _roots() -> tuple[Path, Path | None]:
    from harness import code_identity

    package = code_identity.package_root()
    if (package.parent / ".git").exists():
        return package, package.parent
    import subprocess

    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return package, None
    return package, (Path(top.stdout.strip()) if top.returncode == 0 and top.stdout.strip() else None)


def _records(run_dir: Path) -> list[Path]:
    folder = run_dir / "footprint"
    return sorted(folder.glob("*.paths")) if folder.is_dir() else []


def merge_run(run_dir: str | os.PathLike) -> dict | None:
    """The footprint of the run at ``run_dir`` (see the module docstring); None without records."""
    run_dir = Path(run_dir).resolve()
    records = _records(run_dir)
    if not records:
        return None
    package, checkout = _roots()
    files: set[str] = set()
    dirs: set[str] = set()
    dists: dict[str, str] = {}
    unresolved: set[str] = set()
    pythons: set[str] = set()
    lines: set[str] = set()
    for record in records:  # the processes share most of their lines (a zygote's children): classify each once
        lines.update(record.read_text("utf-8", "surrogateescape").splitlines())
    external = 0
    for line in sorted(lines):
        kind, _, rest = line.partition(" ")
        if kind == "P":
            pythons.add(rest.split(" ", 1)[0])
            continue
        if kind not in ("F", "D") or not rest.startswith("/"):
            continue
        where = _classify(rest, kind, package, checkout, run_dir)
        if where is None:
            external += 1
        elif where[0] == "repo" and kind == "F":
            files.add(where[1])
        elif where[0] == "repo" and os.path.isdir(os.path.join(checkout or package.parent, where[1])):
            dirs.add(where[1])  # (a listing that failed, such as an import hook's fake path entry, is not)
        elif where[0] == "dist" and kind == "F":
            dists[where[1]] = where[2]
        elif where[0] == "unresolved" and kind == "F":
            unresolved.add(where[1])
    return {"format": FORMAT, "python": sorted(pythons), "files": sorted(files), "dirs": sorted(dirs),
            "distributions": dict(sorted(dists.items())), "unresolved": sorted(unresolved),
            "processes": len(records), "external": external}


def write_footprint(run_dir: str | os.PathLike) -> dict | None:
    """Merge and write ``RUN_DIR/footprint.json``; returns the document (None: no records)."""
    doc = merge_run(run_dir)
    if doc is not None:
        data = json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=True) + "\n"
        (Path(run_dir) / RUN_FILE).write_text(data, encoding="ascii")
    return doc


def _classify(path: str, kind: str, package: Path, checkout: Path | None, run_dir: Path):
    path = os.path.normpath(path)
    m = _PYC.match(path)
    if m and kind == "F":
        path = f"{m['dir']}/{m['name']}.py"
    if _under(path, str(run_dir)):
        return None
    site = _SITE.match(path)
    if site:
        if kind == "D":
            return ("dist-dir", "")
        if _METADATA.search(site["rel"]):
            return None  # a distribution's metadata read (entry points, version): not its code
        owner = _owners(site["site"]).get(site["rel"].split("/", 1)[0])
        if owner is None:
            return ("unresolved", "site-packages/" + site["rel"])
        return ("dist", owner[0], owner[1])
    if _under(path, str(package)):
        return ("repo", "harness" + path[len(str(package)):])
    if checkout is not None and _under(path, str(checkout)):
        rel = path[len(str(checkout)) + 1:]
        if rel and _is_venv(checkout / rel.split("/", 1)[0]):
            return None  # an environment inside the checkout (.venv/bin/...): its packages are counted above
        return ("repo", rel)
    return None


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


@cache
def _is_venv(folder: Path) -> bool:
    return (folder / "pyvenv.cfg").is_file()


@cache
def _owners(site: str) -> dict[str, tuple[str, str]]:
    """Top-level entry of ``site`` (package folder, module file, .pth, .dist-info folder) -> (name, version)."""
    from importlib import metadata

    out: dict[str, tuple[str, str]] = {}
    for dist in metadata.distributions(path=[site]):
        name = (dist.metadata.get("Name") or "").strip()
        if not name:
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()
        tops: set[str] = set()
        for entry in dist.files or ():
            first = str(entry).split("/", 1)[0]
            if first and first != "..":
                tops.add(first)
        egg = getattr(dist, "_path", None)
        if egg is not None:
            tops.add(Path(str(egg)).name)
        for top in tops:
            out.setdefault(top, (key, dist.version))
            if top.endswith(".py"):
                out.setdefault(top[:-3], (key, dist.version))
    return out
