"""Which golden workloads a change since a git revision can affect (gate half, stdlib only).

Contract: ``affected(base, goldens_root, platform)`` returns one ``Selection`` per workload
scheduled on ``platform``, in name order, each ``selected`` with the first reason found, or
not. Sound by construction: a workload is left out only when every changed path is proven
outside what its golden's run read; everything else selects it:

1. a changed path that decides verdicts or how processes start for every workload
   (``ALWAYS``: ci/, .ci/, pyproject.toml, the pytest plugin and session, the gate-half
   packages, this package, the scripts that run in processes the recorder never enters),
   or a changed path that is not a plain file (a submodule, a directory) -> every workload;
2. a changed file under the workload's own folder (``goldens/<w>/``: its spec, any golden);
3. no ``FOOTPRINT.json`` in one of its goldens of ``platform`` (a cuda golden recorded
   elsewhere, one stored before footprints), or one that does not read as a footprint;
4. another interpreter version, or a recorded distribution whose installed version differs
   or that is not installed; a third-party file no distribution owned (``unresolved``);
5. a changed file the footprint lists; a file added or removed in a directory it lists:
   changed since BASE, or since the commit the golden's footprint was recorded at (its
   PROVENANCE.json ``repository.commit``, else ``commit``): a listed file changed after the
   recording may read files the footprint does not name, so the footprint proves nothing
   until the golden is refreshed; a golden whose commit is not recorded or does not resolve
   is selected.

Changed paths: ``git diff --raw BASE`` (committed, staged and unstaged changes against
BASE) plus untracked files not ignored, relative to the work tree holding the goldens root.
``AffectedError`` (exit 2 in the CLI) for a goldens root outside a git work tree or a BASE
that does not name a commit.
"""

from __future__ import annotations

import json
import platform as _platform
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harness.footprint.schema import GOLDEN_FILE, problems

__all__ = ["ALWAYS", "AffectedError", "Change", "Selection", "affected", "changed_paths"]

# Paths whose change can move every verdict, whatever a run read: (prefix, why).
ALWAYS: tuple[tuple[str, str], ...] = (
    ("ci/", "CI scripts"),
    (".ci/", "CI scripts"),
    ("pyproject.toml", "the project's configuration (dependencies, pytest options)"),
    ("setup.cfg", "the project's configuration"),
    ("setup.py", "the project's configuration"),
    ("conftest.py", "pytest configuration"),
    ("suites/conftest.py", "pytest configuration"),
    ("suites/golden/", "the golden tests"),
    ("harness/__init__.py", "the harness package"),
    ("harness/pytest_", "the pytest plugin and session (they decide verdicts)"),
    ("harness/flows.py", "the gate flows (run, compare, store)"),
    ("harness/docio.py", "how the gate reads documents"),
    ("harness/numerics.py", "the numerics key goldens are stored under"),
    ("harness/code_identity.py", "the code identity check"),
    ("harness/footprint/", "the footprint recorder and this selection"),
    ("harness/spec/", "spec loading and planning"),
    ("harness/registry/", "the backend registries"),
    ("harness/manifest/", "the manifest"),
    ("harness/surfaces/", "the surfaces"),
    ("harness/parity/", "the comparison"),
    ("harness/store/", "the golden store"),
    ("harness/artifacts/", "the run-directory format"),
    ("harness/postflight/", "the postflight"),
    ("harness/portable/", "the CPU numerics pins"),
    ("harness/runner/worker_exec.py", "Ray's worker start script (runs before any recorder)"),
    ("harness/runner/zygote_client.py", "the zygote client (runs before any recorder)"),
)


class AffectedError(ValueError):
    """The selection cannot be made (not a git work tree, BASE does not resolve)."""


@dataclass(frozen=True)
class Change:
    path: str      # relative to the work tree, posix
    status: str    # A added, D deleted, M modified, T type changed, U unmerged, ? untracked
    plain: bool    # a regular file or symlink on both sides (not a submodule)


@dataclass(frozen=True)
class Selection:
    workload: str
    selected: bool
    reason: str    # the first reason it is selected; "" when not


def _git(top: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(top), *args], capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise AffectedError(f"git {' '.join(args)}: {exc}") from None


def work_tree(path: Path) -> Path:
    """The git work tree holding ``path``; AffectedError when there is none."""
    out = _git(path, "rev-parse", "--show-toplevel")
    if out.returncode != 0 or not out.stdout.strip():
        raise AffectedError(f"{path}: not inside a git work tree, so no change can be proven harmless "
                            "(run every golden)")
    return Path(out.stdout.decode().strip())


def changed_paths(top: Path, base: str) -> list[Change]:
    """Every path changed since ``base`` in the work tree ``top`` (see the module docstring)."""
    ok = _git(top, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    if ok.returncode != 0:
        raise AffectedError(f"BASE {base!r} does not name a commit in {top} (git rev-parse --verify "
                            f"{base}^{{commit}} failed)")
    diff = _git(top, "diff", "--raw", "--no-renames", "-z", "--no-ext-diff", ok.stdout.decode().strip(), "--")
    if diff.returncode != 0:
        raise AffectedError(f"git diff {base}: {diff.stderr.decode(errors='replace').strip()}")
    fields = diff.stdout.decode("utf-8", "surrogateescape").split("\0")
    out: list[Change] = []
    i = 0
    while i + 1 < len(fields) and fields[i].startswith(":"):
        meta, path = fields[i].split(), fields[i + 1]
        modes, status = meta[0:2], meta[4][:1]
        plain = all(m.lstrip(":")[:2] in ("10", "12", "00") for m in modes)  # file, symlink, absent; 160000: gitlink
        out.append(Change(path, status, plain))
        i += 2
    untracked = _git(top, "ls-files", "--others", "--exclude-standard", "-z")
    for path in untracked.stdout.decode("utf-8", "surrogateescape").split("\0"):
        if path:
            out.append(Change(path, "?", not (top / path).is_dir()))
    return out


def affected(base: str, goldens_root: Path, platform: str | None = None) -> list[Selection]:
    """One Selection per workload under ``goldens_root`` scheduled on ``platform`` (default: the
    host's, as ``pytest -m golden`` picks it)."""
    from harness.spec.errors import SpecError
    from harness.spec.load import golden_platform, list_workloads, load_spec
    from harness.store.variants import base_platform

    root = Path(goldens_root).resolve()
    top = work_tree(root)
    changes = changed_paths(top, base)
    since: dict[str, list[Change] | None] = {}  # commit -> changes since it (footprints recorded earlier)
    everything = _reason_for_all(changes)
    try:
        root_rel = root.relative_to(top).as_posix()
    except ValueError:
        raise AffectedError(f"{root}: not inside the work tree {top}") from None
    out = []
    for name in list_workloads(root):
        try:
            spec = load_spec(name, goldens_root=root)
        except SpecError as exc:
            out.append(Selection(name, True, f"its spec does not load ({exc})"))
            continue
        plat = platform or (golden_platform(spec.to_dict()) if spec.platform.device == "cpu" else "cpu")
        if base_platform(plat) not in spec.platform.platforms:
            continue
        if everything:
            out.append(Selection(name, True, everything))
            continue
        folders = sorted(p for p in (root / name).iterdir()
                         if p.is_dir() and base_platform(p.name) == base_platform(plat))
        own = f"{name}/" if root_rel == "." else f"{root_rel}/{name}/"
        out.append(Selection(name, *_why(folders, changes, own, lambda c: _since_recorded(top, c, since))))
    return out


def _since_recorded(top: Path, commit: str, memo: dict) -> list[Change] | None:
    """Changes in ``top`` since the commit a footprint was recorded at (None: it does not
    resolve); ``memo`` holds one ``affected`` call's answers."""
    if commit not in memo:
        try:
            memo[commit] = changed_paths(top, commit)
        except AffectedError:
            memo[commit] = None
    return memo[commit]


def _recorded_commit(folder: Path) -> str | None:
    """The commit a golden (and so its footprint) was recorded at: PROVENANCE.json's
    ``repository.commit``, else ``commit``."""
    try:
        prov = json.loads((folder / "PROVENANCE.json").read_bytes())
    except (OSError, ValueError):
        return None
    repo = prov.get("repository") if isinstance(prov, dict) else None
    commit = (repo or {}).get("commit") if isinstance(repo, dict) else None
    commit = commit or (prov.get("commit") if isinstance(prov, dict) else None)
    return commit if isinstance(commit, str) and commit else None


def _reason_for_all(changes: list[Change]) -> str:
    for change in changes:
        if not change.plain:
            return f"{change.path}: changed, and not a plain file (a submodule or directory)"
        for prefix, why in ALWAYS:
            if change.path == prefix or (prefix.endswith(("/", "_")) and change.path.startswith(prefix)):
                return f"{change.path}: {why}"
    return ""


def _why(folders: list[Path], changes: list[Change], own: str, since=None) -> tuple[bool, str]:
    """(selected, reason) for one workload; ``since(commit)``: the changes since a commit
    (None when it does not resolve), for footprints recorded before BASE."""
    for change in changes:
        if change.path.startswith(own):
            return True, f"{change.path}: the workload's own folder (spec or golden)"
    if not folders:
        return True, "no golden on this platform (nothing recorded)"
    docs = []
    for folder in folders:
        path = folder / GOLDEN_FILE
        if not path.is_file():
            return True, f"no footprint recorded ({folder.name}/{GOLDEN_FILE} missing)"
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            return True, f"{folder.name}/{GOLDEN_FILE} unreadable ({exc})"
        bad = problems(doc, f"{folder.name}/{GOLDEN_FILE}")
        if bad:
            return True, bad[0]
        later: list[Change] = []
        if since is not None:
            commit = _recorded_commit(folder)
            later = since(commit) if commit else None
            if later is None:
                return True, (f"{folder.name}: the commit its footprint was recorded at "
                              f"({commit or 'not recorded'}) is not in this repository, so the footprint "
                              "cannot be dated")
        docs.append((folder.name, doc, frozenset(doc["files"]), frozenset(doc["dirs"]), later))
    for plat, doc, _, _, _ in docs:
        here = _platform.python_version()
        if doc["python"] != [here]:
            return True, f"the interpreter: {plat} recorded Python {', '.join(doc['python'])}, this is {here}"
        for dist, version in doc["distributions"].items():
            now = _installed(dist)
            if now != version:
                return True, f"dependency {dist}: {version} recorded, {now or 'not installed'} now"
        if doc["unresolved"]:
            return True, f"{plat} read files no installed distribution owns ({doc['unresolved'][0]}, ...)"
    for plat, _, files, dirs, later in docs:
        for stale, group in ((False, changes), (True, later)):
            for change in group:
                parent = change.path.rsplit("/", 1)[0] if "/" in change.path else ""
                hit = change.path in files or (change.status in ("A", "D", "?") and parent in dirs)
                if not hit:
                    continue
                what = ("read by its run" if change.path in files
                        else f"added or removed in {parent or 'the top folder'}, which its run listed")
                if stale:
                    return True, (f"{change.path}: {what}, and changed since its footprint was recorded "
                                  f"({plat}/{GOLDEN_FILE}: refresh the golden to narrow the selection)")
                return True, f"{change.path}: {what} ({plat}/{GOLDEN_FILE})"
    return False, ""


@cache
def _installed(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
