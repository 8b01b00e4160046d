"""Atomic golden writes and consistent reads.

Invariant: at every instant ``goldens/<workload>/<platform>/`` is either absent
(no golden yet) or a *complete* golden, the previous one or the new one, never a
mix, whatever point a writer is killed at (SIGKILL, power loss after fsync).

How
---
* Everything happens under ``flock`` on the workload directory, so writers are
  serialised and a reader never overlaps a swap. The kernel drops the lock when a
  process dies, so a lock held by a killed writer never blocks anyone.
* The new golden is built in ``.<platform>.tmp-XXXX/`` beside the target; every file
  and directory is fsynced.
* No previous golden: ``rename(tmp, target)``. Previous golden: ``renameat2(tmp,
  target, RENAME_EXCHANGE)`` swaps the two directories in one step (the old one
  ends up under the tmp name and is deleted). Where exchange is unsupported, the
  fallback is ``rename(target, .old-XXXX)`` then ``rename(tmp, target)``; a crash
  between the two leaves no target, and recovery renames ``.old-XXXX`` back.
* ``recover`` (run under the lock by every read and write) restores a missing
  target from ``.old-*`` and deletes every leftover ``.tmp-*`` / ``.old-*`` sibling.

What the files must hold is ``harness.store.integrity``'s (validated before a write,
checked after a read); the ``Golden`` record and the errors are ``harness.store.golden``'s
(re-exported here).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.docio import Limits, read_bytes
from harness.store import layout, lock
from harness.store.golden import ANY, Golden, GoldenChanged, GoldenStoreError, files_digest
from harness.store.integrity import golden_files, golden_problems, listed_surfaces, load_strict_bytes
from harness.store.provenance import provenance_errors
from harness.surfaces.canonical import StrictJSONError
from harness.surfaces.digest import sha256_hex

__all__ = ["ANY", "Golden", "GoldenChanged", "GoldenStoreError", "write_golden", "read_golden", "read_golden_dir",
           "recover", "workload_lock", "golden_digest", "golden_problems"]


# --- low-level file system helpers -------------------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc = None


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2). False when unsupported here."""
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.renameat2  # noqa: B018 - attribute probe
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    rc = _libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


@contextmanager
def workload_lock(workload_dir: Path) -> Iterator[None]:
    """Exclusive flock on the workload directory (created if missing)."""
    workload_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(workload_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _recover_locked(workload_dir: Path, platform: str) -> list[Path]:
    target = workload_dir / platform
    olds = sorted(workload_dir.glob(layout.old_prefix(platform) + "*"), key=lambda p: p.stat().st_mtime)
    removed: list[Path] = []
    if not target.exists() and olds:
        newest = olds.pop()
        os.rename(newest, target)  # the previous complete golden comes back
        removed.append(newest)
    for leftover in olds + sorted(workload_dir.glob(layout.temp_prefix(platform) + "*")):
        shutil.rmtree(leftover, ignore_errors=True)
        removed.append(leftover)
    if removed:
        _fsync_dir(workload_dir)
    return removed


def recover(root: str | Path, workload: str, platform: str) -> list[Path]:
    """Clean up after interrupted writes of one golden; returns the leftovers handled."""
    target = layout.golden_dir(root, workload, platform)
    if not target.parent.is_dir():
        return []
    with workload_lock(target.parent):
        return _recover_locked(target.parent, platform)


# --- write ---------------------------------------------------------------------------

def write_golden(root: str | Path, workload: str, platform: str, manifest: Mapping[str, Any],
                 surfaces: Mapping[str, Mapping[str, Any]], provenance: Mapping[str, Any], *,
                 tolerances: str | None = None, expect: object = ANY,
                 footprint: Mapping[str, Any] | None = None) -> Path:
    """Atomically create or replace ``<root>/<workload>/<platform>/``; returns its path.

    The stored manifest's ``surfaces`` list is rewritten to describe the stored
    surface files (canonical bytes + newline, sha256 of the file). ``tolerances``
    is the text of a tolerances.yaml (kept verbatim). Inputs are validated before
    anything touches the disk; GoldenStoreError names the failing file/field.

    ``expect`` is a compare-and-swap on the previous golden, checked under the
    workload lock: ``None`` means "no golden may exist", a digest (``Golden.digest``
    or ``golden_digest``) means "the stored golden is still that one". Otherwise
    ``GoldenChanged`` is raised and nothing is written. ``ANY`` (default) replaces
    whatever is stored.
    """
    target = layout.golden_dir(root, workload, platform)
    files = golden_files(workload, manifest, surfaces, provenance, tolerances, platform=platform, footprint=footprint)
    workload_dir = target.parent
    _refuse_symlinked_workload(workload_dir)
    lock.read_lock(root)  # an index that cannot be read refuses the write before anything changes
    locked = os.path.lexists(Path(root) / lock.LOCK_FILE)
    seed = None if locked else root_entries(root, skip=lock.key(workload, platform))  # read before any lock
    with workload_lock(workload_dir):
        _recover_locked(workload_dir, platform)
        if expect is not ANY:
            current = _digest_locked(target)
            if current != expect:
                seen = "no golden" if expect is None else f"golden {str(expect)[:12]}"
                now = "none" if current is None else f"golden {current[:12]}"
                raise GoldenChanged(
                    f"{target}: changed while this command ran (it compared against {seen}, the store now holds "
                    f"{now}: another capture/refresh wrote it); nothing stored. Rerun to compare against the "
                    "current golden")
        lock.stage(root, workload, platform, files, on_disk=_files_locked(target), seed=seed)  # old and new accepted
        tmp = Path(tempfile.mkdtemp(prefix=layout.temp_prefix(platform), dir=workload_dir))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a golden is a normal checked-in folder
        (tmp / layout.SURFACES_DIR).mkdir()
        for rel, data in files.items():
            _write_file(tmp / rel, data)
        _fsync_dir(tmp / layout.SURFACES_DIR)
        _fsync_dir(tmp)
        if not target.exists():
            os.rename(tmp, target)
            _fsync_dir(workload_dir)
        elif _exchange(tmp, target):
            _fsync_dir(workload_dir)
            shutil.rmtree(tmp)  # now holds the previous golden
        else:
            old = Path(tempfile.mkdtemp(prefix=layout.old_prefix(platform), dir=workload_dir))
            os.rmdir(old)
            os.rename(target, old)
            os.rename(tmp, target)
            _fsync_dir(workload_dir)
            shutil.rmtree(old)
        lock.record(root, workload, platform, files)  # still under the workload lock: in write order
    return target


def root_entries(root: str | Path, *, skip: str | None = None) -> dict[str, dict]:
    """The lock entries (``lock.entry_for``) of every golden under ``root`` that reads cleanly,
    its lock aside (``skip``: a key left out). Takes each workload's lock in turn, so the caller
    must hold none."""
    root = Path(root)
    entries: dict[str, dict] = {}
    if not root.is_dir():
        return entries
    for workload_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if workload_dir.is_symlink():
            continue
        for golden in sorted(p for p in workload_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            name = lock.key(workload_dir.name, golden.name)
            if name == skip:
                continue
            try:
                found = _read_golden(root, workload_dir.name, golden.name, check_lock=False)
            except (GoldenStoreError, FileNotFoundError, ValueError):
                continue  # a damaged golden is not locked: a read refuses it either way
            entries[name] = lock.entry_for(found.files)
    return entries


# --- read ----------------------------------------------------------------------------

class Unread(bytes):
    """The bytes of a file under a golden that is not read (neither the manifest, the
    provenance, the tolerances nor a surface the manifest lists): its name is what makes
    the golden damaged, its content is never loaded."""


UNREAD = Unread()


def _listing(target: Path) -> dict[str, int]:
    """Relative path -> size (``lstat``) of every file under ``target``, nothing read. A golden
    holds regular files and its ``surfaces/`` folder only: a symlink, another folder or a
    special file is refused (GoldenStoreError)."""
    sizes: dict[str, int] = {}
    for folder, dirs, names in os.walk(target, followlinks=False):
        for name in sorted(dirs):
            if os.path.islink(os.path.join(folder, name)):
                raise GoldenStoreError(f"{os.path.join(folder, name)}: is a symlink (a golden stores regular "
                                       "files only)")
            if not (Path(folder) == target and name == layout.SURFACES_DIR):
                raise GoldenStoreError(f"{os.path.join(folder, name)}: is a directory (a golden holds regular files "
                                       f"and its {layout.SURFACES_DIR}/ folder only)")
        for name in sorted(names):
            path = Path(folder) / name
            info = path.lstat()
            if path.is_symlink():
                raise GoldenStoreError(f"{path}: is a symlink (a golden stores regular files only)")
            if not stat.S_ISREG(info.st_mode):
                raise GoldenStoreError(f"{path}: is not a regular file (a golden stores regular files only)")
            sizes[path.relative_to(target).as_posix()] = info.st_size
    return sizes


def _listed_surfaces(manifest_bytes: bytes, source: str, limits: Limits) -> set[str]:
    """The ``surfaces[].path`` strings of a stored manifest (nothing when it does not parse:
    the reader of the golden reports that)."""
    from harness.docio import parse_json

    try:
        doc = parse_json(manifest_bytes, source=source, limits=limits)
    except StrictJSONError:
        return set()
    entries = doc.get("surfaces") if isinstance(doc, dict) else None
    return {e["path"] for e in entries if isinstance(e, dict) and isinstance(e.get("path"), str)} \
        if isinstance(entries, list) else set()


def _read_tree(target: Path, limits: Limits) -> dict[str, bytes]:
    """Relative path -> bytes of the files of the golden at ``target``, in one order for every
    command (issue 41): the listing first (``_listing``: structure and sizes, nothing read),
    then the manifest, then the provenance, the tolerances and the surfaces the manifest
    lists, after checking their sizes sum to at most ``limits.max_total``
    (``GOLDEN_READ_BUDGET``). Any other file is ``UNREAD`` (its name alone damages the
    golden). Each file is also bounded by ``limits.max_bytes``; nothing outside ``target`` is
    opened."""
    sizes = _listing(target)

    def read(rel: str) -> bytes:
        try:
            return read_bytes(target / rel, limits=limits, what="golden file")
        except StrictJSONError as exc:
            raise GoldenStoreError(str(exc)) from None

    files: dict[str, bytes] = {}
    spent = 0
    if layout.MANIFEST in sizes:
        files[layout.MANIFEST] = read(layout.MANIFEST)
        spent = len(files[layout.MANIFEST])
    listed = _listed_surfaces(files[layout.MANIFEST], str(target / layout.MANIFEST), limits) \
        if layout.MANIFEST in files else set()
    wanted = [rel for rel in sizes if rel != layout.MANIFEST
              and (rel in (layout.PROVENANCE, layout.TOLERANCES, layout.FOOTPRINT) or rel in listed)]
    total = spent + sum(sizes[rel] for rel in wanted)
    if total > limits.max_total:
        biggest = ", ".join(f"{rel} {sizes[rel]} bytes" for rel in sorted(wanted, key=lambda r: -sizes[r])[:3])
        raise GoldenStoreError(f"{target}: its files sum to {total} bytes, over the read budget of "
                               f"{limits.max_total} bytes for one golden (GOLDEN_READ_BUDGET; largest: {biggest}); "
                               "nothing else was read")
    for rel in sorted(sizes):
        if rel in files:
            continue
        files[rel] = read(rel) if rel in wanted else UNREAD
    return files


def _files_locked(target: Path) -> dict[str, bytes] | None:
    """The files of the golden at ``target`` (caller holds the workload lock); None when there is
    none or it does not read."""
    if not target.is_dir():
        return None
    try:
        files = _read_tree(target, Limits.from_env())
    except GoldenStoreError:
        return None
    return None if any(isinstance(data, Unread) for data in files.values()) else files


def _digest_locked(target: Path) -> str | None:
    if not target.is_dir():
        return None
    try:
        return files_digest(_read_tree(target, Limits.from_env()))
    except GoldenStoreError as exc:  # a damaged golden still has an identity
        return sha256_hex(str(exc).encode("utf-8", "surrogateescape"))


def golden_digest(root: str | Path, workload: str, platform: str) -> str | None:
    """The digest of the stored golden (``write_golden(expect=...)``), None when there is none."""
    target = layout.golden_dir(root, workload, platform)
    if not target.parent.is_dir():
        return None
    with workload_lock(target.parent):
        _recover_locked(target.parent, platform)
        return _digest_locked(target)


def _refuse_symlinked_workload(workload_dir: Path) -> None:
    """A workload folder of the goldens root that is a symlink would read (or write) goldens
    outside the root: refused, as a symlink inside a golden is."""
    if workload_dir.is_symlink():
        raise GoldenStoreError(f"{workload_dir}: is a symlink (a goldens root holds its workload folders; name "
                               "the golden directory itself to compare against one elsewhere)")


def read_golden(root: str | Path, workload: str, platform: str) -> Golden:
    """Read a complete golden (after recovering from any interrupted write).

    Raises FileNotFoundError if there is no golden, GoldenStoreError for anything
    ``golden_problems`` finds (the first few, each naming its file and pointer): a
    symlink, a folder other than ``surfaces/`` or an over-limit file, a file the store
    never writes, a document that is not strict JSON, a manifest that is not a valid
    schema v2 manifest of a complete run of this workload, surface files missing,
    unlisted or differing from the sha256 the manifest records, a gated surface
    missing or without sections, a surface failing its schema, an invalid
    tolerances.yaml; a PROVENANCE.json with invalid fields (``provenance_errors``); and,
    in a root with a goldens lock (``harness.store.lock``), files that differ from the
    golden's entry there, or no entry.
    """
    return _read_golden(root, workload, platform, check_lock=True)


def _read_golden(root: str | Path, workload: str, platform: str, *, check_lock: bool) -> Golden:
    target = layout.golden_dir(root, workload, platform)
    if not target.parent.is_dir():
        raise FileNotFoundError(f"no golden for workload {workload!r}: {target.parent} does not exist")
    _refuse_symlinked_workload(target.parent)
    limits = Limits.from_env()
    with workload_lock(target.parent):
        _recover_locked(target.parent, platform)
        if not target.is_dir() or target.is_symlink():
            if target.is_symlink():
                raise GoldenStoreError(f"{target}: is a symlink (a golden is a directory of regular files)")
            raise FileNotFoundError(f"no golden for {workload} on platform {platform!r}: {target} does not exist")
        files = _read_tree(target, limits)
    try:
        manifest = load_strict_bytes(files, layout.MANIFEST, target, limits)
        provenance = load_strict_bytes(files, layout.PROVENANCE, target, limits)
        surfaces = listed_surfaces(target, manifest, files, limits)
    except ValueError as exc:
        raise GoldenStoreError(str(exc)) from None
    problems = golden_problems(target, manifest, files, surfaces)
    problems += [f"{target / layout.PROVENANCE}#/{p.split(':')[0] if ':' in p else ''}: {p}"
                 for p in provenance_errors(provenance)]
    if problems:
        more = f" (and {len(problems) - 3} more problem(s): golden lint lists them)" if len(problems) > 3 else ""
        raise GoldenStoreError("; ".join(problems[:3]) + more)
    if check_lock:
        problem = lock.lock_problem(root, workload, platform, files, limits)
        if problem:
            raise GoldenStoreError(problem)
    tolerances = target / layout.TOLERANCES if layout.TOLERANCES in files else None
    return Golden(path=target, workload=workload, platform=platform, manifest=manifest, surfaces=surfaces,
                  provenance=provenance, tolerances_path=tolerances, files=files, digest=files_digest(files))


def read_golden_dir(path: str | Path) -> Golden:
    """Read a golden directory given by path (``.../<workload>/<platform>``)."""
    path = Path(path).resolve()
    return read_golden(path.parent.parent, path.parent.name, path.name)
