"""``golden lock``: bring a root's goldens lock up to date without re-blessing anything.

``sync(root)`` adds every golden the index does not name yet and that reads cleanly (the
first lock of a root whose goldens predate it; a golden copied in on purpose), and drops the
entries of goldens that no longer exist. A golden whose files differ from its entry is never
re-recorded here (that is what the lock exists to catch): it is reported, and only a
``golden refresh`` rewrites its entry. A ``pending`` entry left by a writer killed between the
two steps of a write is settled to whichever of its states the golden on disk is. Stdlib only
(gate half).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.store import lock
from harness.store.atomic import root_entries
from harness.store.golden import GoldenStoreError

__all__ = ["LockSync", "sync"]


@dataclass
class LockSync:
    """What ``sync`` did: keys added and dropped, and the goldens it left refused (key -> why)."""

    created: bool = False
    added: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)  # a staged write (``pending``) resolved to the golden on disk
    refused: dict[str, str] = field(default_factory=dict)


def _golden_keys(root: Path) -> set[str]:
    keys = set()
    for workload_dir in (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        keys |= {lock.key(workload_dir.name, g.name) for g in workload_dir.iterdir()
                 if g.is_dir() and not g.name.startswith((".", "_"))}
    return keys


def sync(root: str | Path) -> LockSync:
    """Add unlocked goldens that read cleanly and drop entries of goldens that are gone;
    report the rest. GoldenStoreError when the index exists but cannot be read."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"goldens root {root} is not a directory")
    lock.read_lock(root)  # unreadable: refused before anything is read or written
    clean = root_entries(root)  # read outside every lock (root_entries takes the workload locks)
    out = LockSync()
    with lock.root_lock(root):
        index = lock.read_lock(root)
        out.created = index is None
        index = dict(index or {})
        present = _golden_keys(root)
        for name in sorted(present):
            entry = clean.get(name)
            if name not in index:
                if entry is None:
                    out.refused[name] = "does not read cleanly (golden lint names why); not locked"
                else:
                    index[name] = entry
                    out.added.append(name)
            elif entry is None or all(state["digest"] != entry["digest"] for state in lock.accepted(index[name])):
                out.refused[name] = ("differs from its entry in the lock, or does not read cleanly: only "
                                     "`golden refresh` rewrites a locked golden's entry")
            elif "pending" in index[name]:  # a write died between its two steps: the golden on disk settles it
                index[name] = entry
                out.settled.append(name)
        for name in sorted(set(index) - present):
            del index[name]
            out.dropped.append(name)
        if out.created or out.added or out.dropped or out.settled:
            lock.write_lock(root, index)
    return out


def describe(result: LockSync, root: Path) -> list[str]:
    lines = [f"added {name}" for name in result.added] + [f"dropped {name} (no such golden)" for name in result.dropped]
    lines += [f"settled {name} (an interrupted write: the entry now names the golden on disk)"
              for name in result.settled]
    lines += [f"refused {name}: {why}" for name, why in sorted(result.refused.items())]
    return lines


__all__ += ["describe", "GoldenStoreError"]
