"""The goldens lock: one reviewed index of what every golden of a root holds.

``<root>/GOLDENS.lock`` maps each golden (``<workload>/<platform>``) to the sha256 of
every file it holds and to their combined digest (``golden.files_digest``, the
``Golden.digest`` a read computes). Only the store writes it: ``write_golden`` (every
capture and refresh) records the golden it stored, and ``golden lock`` adds goldens the
index does not know yet (the first lock of a root) and drops entries of goldens that are
gone. Nothing re-blesses a golden whose content changed: that takes a refresh.

Why: a golden edited consistently by hand (a value changed, the manifest's sha256 fixed)
reads as a sound golden. With the lock, every read of a golden (``read_golden``: check,
diff, the pytest gate, lint) refuses one whose files differ from its entry, naming the
files, so a hand edit has to change two files, the golden and this index, and shows up
in review as exactly that.

Contract:
* no ``GOLDENS.lock`` in a root: goldens are read unlocked (``lock_problem`` says
  nothing; lint reports ``unlocked_root``); the first ``write_golden`` into the root
  creates the index, with every other golden of the root that reads cleanly;
* an index that exists is read strictly (strict JSON within ``harness.docio`` limits,
  the format below); one it cannot read refuses every golden of the root (fail closed);
* a write is recorded in two steps, both under the workload lock: ``stage`` before the
  golden's directory is swapped in (the entry then also accepts the new files, as
  ``pending``), ``record`` after it (the entry holds the new files only). A writer killed
  at any point leaves an entry that accepts the golden on disk, the previous one or the
  new one, as the store's own crash invariant promises; the next write of that golden, or
  ``golden lock``, settles a ``pending`` left behind. Each step rewrites the index
  atomically (temporary file, fsync, rename, fsync of the folder) under an exclusive
  ``flock`` on the root, so concurrent writers of different goldens both land.

Format (sorted keys, one trailing newline)::

    {"format": 1,
     "goldens": {"<workload>/<platform>": {"digest": "<sha256>",
                                            "files": {"<relative path>": "<sha256>", ...},
                                            "pending": {"digest": ..., "files": {...}}}}}

``digest``/``files`` are absent while the first write of a golden is staged; ``pending`` is
present only between the two steps of a write (or after a writer died there).

Stdlib only (gate half).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from harness.docio import Limits, parse_json, read_bytes
from harness.store.golden import GoldenStoreError, files_digest
from harness.surfaces.canonical import StrictJSONError
from harness.surfaces.digest import sha256_hex

__all__ = ["LOCK_FILE", "FORMAT", "LockIndex", "key", "read_lock", "lock_problem", "stage", "record", "entry_for",
           "accepted", "root_lock", "write_lock"]

LOCK_FILE = "GOLDENS.lock"
FORMAT = 1
_HEX = re.compile(r"^[0-9a-f]{64}$")

LockIndex = dict[str, dict]  # "<workload>/<platform>" -> {"digest": str, "files": {rel: sha256}}


def key(workload: str, platform: str) -> str:
    """The index key of a golden."""
    return f"{workload}/{platform}"


def entry_for(files: Mapping[str, bytes]) -> dict:
    """The index entry of a golden holding ``files`` (relative path -> bytes)."""
    digests = {rel: sha256_hex(bytes(data)) for rel, data in sorted(files.items())}
    return {"digest": files_digest(files), "files": digests}


def read_lock(root: str | Path, limits: Limits | None = None) -> LockIndex | None:
    """The index of ``root``, None when the root has none. GoldenStoreError (naming the file
    and the JSON pointer) for an index that is not a regular file, not strict JSON, or not of
    the format above."""
    path = Path(root) / LOCK_FILE
    if not os.path.lexists(path):
        return None
    if path.is_symlink() or not path.is_file():
        raise GoldenStoreError(f"{path}: is not a regular file (the goldens lock is one JSON file)")
    try:
        doc = parse_json(read_bytes(path, limits=limits, what="goldens lock"), source=str(path), limits=limits)
    except StrictJSONError as exc:
        raise GoldenStoreError(f"{exc} (the goldens lock: restore it from version control, or delete it and "
                               "run `golden lock`)") from None
    return _validated(doc, path)


def _validated(doc: object, path: Path) -> LockIndex:
    def bad(pointer: str, why: str) -> GoldenStoreError:
        return GoldenStoreError(f"{path}#{pointer}: {why} (the goldens lock is written by golden capture/refresh/lock "
                                "only: restore it from version control, or delete it and run `golden lock`)")

    if not isinstance(doc, dict) or set(doc) != {"format", "goldens"}:
        raise bad("", "must be an object with exactly the keys 'format' and 'goldens'")
    if doc["format"] != FORMAT or isinstance(doc["format"], bool):
        raise bad("/format", f"must be {FORMAT}, found {doc['format']!r}")
    goldens = doc["goldens"]
    if not isinstance(goldens, dict):
        raise bad("/goldens", "must be an object")
    for name, entry in goldens.items():
        pointer = "/goldens/" + name.replace("~", "~0").replace("/", "~1")
        if name.count("/") != 1 or not all(name.split("/")):
            raise bad(pointer, "a key must be '<workload>/<platform>'")
        if not isinstance(entry, dict) or set(entry) not in ({"digest", "files"}, {"digest", "files", "pending"},
                                                             {"pending"}):
            raise bad(pointer, "must be an object with the keys 'digest' and 'files' (and 'pending' while a write "
                      "is staged)")
        if "digest" in entry:
            _validated_files(entry, pointer, bad)
        if "pending" in entry:
            if not isinstance(entry["pending"], dict) or set(entry["pending"]) != {"digest", "files"}:
                raise bad(pointer + "/pending", "must be an object with exactly the keys 'digest' and 'files'")
            _validated_files(entry["pending"], pointer + "/pending", bad)
    return goldens


def _validated_files(entry: dict, pointer: str, bad) -> None:
    if not isinstance(entry["digest"], str) or not _HEX.match(entry["digest"]):
        raise bad(pointer + "/digest", "must be a sha256 (64 lowercase hex digits)")
    files = entry["files"]
    if not isinstance(files, dict) or not files:
        raise bad(pointer + "/files", "must be a non-empty object of relative path -> sha256")
    for rel, digest in files.items():
        if not isinstance(digest, str) or not _HEX.match(digest):
            raise bad(f"{pointer}/files/{rel}", "must be a sha256 (64 lowercase hex digits)")
    listing = "".join(f"{rel}\0{digest}\n" for rel, digest in sorted(files.items()))
    if sha256_hex(listing.encode("utf-8", "surrogateescape")) != entry["digest"]:
        raise bad(pointer + "/digest", "does not match the file digests listed beside it")


def accepted(entry: dict) -> list[dict]:
    """The recorded states an entry accepts: the stored golden's and a staged write's."""
    return [e for e in (entry if "digest" in entry else None, entry.get("pending")) if e is not None]


def lock_problem(root: str | Path, workload: str, platform: str, files: Mapping[str, bytes],
                 limits: Limits | None = None) -> str | None:
    """Why the golden ``workload/platform`` holding ``files`` is not the one the root's lock
    names (None: it is, or the root has no lock). Names the files that differ."""
    index = read_lock(root, limits)
    if index is None:
        return None
    path = Path(root) / LOCK_FILE
    name = key(workload, platform)
    entry = index.get(name)
    if entry is None:
        return (f"{Path(root) / name}: not in {path} (every golden of a locked root is listed there; capture or "
                "refresh it with `golden capture/refresh`, or `golden lock` if it was copied in deliberately)")
    held = entry_for(files)
    if any(state["digest"] == held["digest"] for state in accepted(entry)):
        return None
    locked, now = (entry if "digest" in entry else entry["pending"])["files"], held["files"]
    changed = sorted(rel for rel in set(locked) | set(now) if locked.get(rel) != now.get(rel))
    shown = ", ".join(f"{rel} ({_change(locked.get(rel), now.get(rel))})" for rel in changed[:5])
    more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
    return (f"{Path(root) / name}: differs from its entry in {path}: {shown}{more}. A golden changes only through "
            "`golden capture/refresh`, which rewrite the lock; an edit by hand shows up here. Refresh it "
            "(`golden refresh <workload> --reason ...`) or restore the files")


def _change(locked: str | None, now: str | None) -> str:
    if locked is None:
        return "not in the lock"
    if now is None:
        return "missing"
    return f"sha256 {now[:12]} where the lock has {locked[:12]}"


@contextmanager
def root_lock(root: Path) -> Iterator[None]:
    """Exclusive flock on the goldens root (taken after a workload lock, never before)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_lock(root: Path, index: Mapping[str, dict]) -> None:
    """Write ``index`` as ``root/GOLDENS.lock`` atomically (caller holds ``root_lock``)."""
    data = (json.dumps({"format": FORMAT, "goldens": dict(sorted(index.items()))}, indent=1, sort_keys=True)
            + "\n").encode()
    for leftover in root.glob("." + LOCK_FILE + ".tmp-*"):  # a writer killed mid-write (we hold the root lock)
        leftover.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + LOCK_FILE + ".tmp-", dir=root)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, root / LOCK_FILE)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def stage(root: str | Path, workload: str, platform: str, files: Mapping[str, bytes], *,
          on_disk: Mapping[str, bytes] | None = None, seed: Mapping[str, dict] | None = None) -> bool:
    """First step of a write (before the golden's directory is swapped in): the entry accepts
    the golden on disk (``on_disk``, its files, None when there is none or it does not read)
    and ``files``, as ``pending``. The golden on disk keeps its place only if the entry
    accepted it already (a write that died earlier left it there): a hand edit is never
    recorded. Creates the index like ``record``; returns whether it did."""
    def staged(entry: dict) -> dict:
        current = {k: v for k, v in entry.items() if k != "pending"}
        if on_disk is not None:
            held = entry_for(on_disk)
            if any(state["digest"] == held["digest"] for state in accepted(entry)):
                current = held
        return {**current, "pending": entry_for(files)}

    return _update(Path(root), key(workload, platform), staged, seed)


def record(root: str | Path, workload: str, platform: str, files: Mapping[str, bytes], *,
           seed: Mapping[str, dict] | None = None) -> bool:
    """Record the golden just stored as ``workload/platform`` (holding ``files``) in the root's
    lock, creating the index when the root has none, then starting from ``seed`` (the entries
    of the root's other goldens, read by the caller before it took any lock: this runs under a
    workload lock, and reading another workload here could deadlock with its writer). Returns
    True when it created the index. An index that cannot be read is not overwritten
    (GoldenStoreError)."""
    return _update(Path(root), key(workload, platform), lambda entry: entry_for(files), seed)


def _update(root: Path, name: str, change, seed: Mapping[str, dict] | None) -> bool:
    """Replace the entry ``name`` of the root's index with ``change(old entry or {})`` under the
    root lock, creating the index (from ``seed``) when the root has none; returns whether it did."""
    with root_lock(root):
        index = read_lock(root)
        created = index is None
        if created:
            index = dict(seed or {})
        index[name] = change(index.get(name, {}))
        write_lock(root, index)
    return created
