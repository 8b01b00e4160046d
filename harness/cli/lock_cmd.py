"""``golden lock``: add the goldens a root's lock does not name yet, drop entries of goldens
that are gone (``harness.store.lock_sync``). Never re-records a golden whose files changed:
that takes ``golden refresh``.

Exit 0 when every golden of the root is locked as it is, 1 when some golden is refused (it
differs from its entry, or does not read cleanly), 2 when the root or its lock cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "record unlocked goldens in the root's GOLDENS.lock (never re-blesses a changed one)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._options import add_goldens_root

    add_goldens_root(parser, type=Path)


def run(args: argparse.Namespace) -> int:
    from harness.cli.lint import default_root
    from harness.store.golden import GoldenStoreError
    from harness.store.lock import LOCK_FILE
    from harness.store.lock_sync import describe, sync

    try:
        root = Path(args.goldens_root or default_root())
        result = sync(root)
    except (ValueError, FileNotFoundError, GoldenStoreError) as exc:
        print(f"golden lock: {exc}", file=sys.stderr)
        return 2
    for line in describe(result, root):
        print(line)
    what = "created" if result.created else ("updated" if result.added or result.dropped else "unchanged")
    print(f"golden lock: {root / LOCK_FILE} {what} ({len(result.added)} added, {len(result.dropped)} dropped, "
          f"{len(result.refused)} refused)", file=sys.stderr)
    return 1 if result.refused else 0
