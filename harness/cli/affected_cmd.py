"""``golden affected BASE``: the golden workloads a change since BASE can affect.

Prints one line per selected workload, ``<workload>\t<first reason>`` (the reason names the
first changed file that made it, or why nothing could be proven), then a count on stderr.
Sound: anything it cannot prove unaffected is printed (``harness.footprint.affected``).
Exit 0 (also when nothing is affected), 2 when BASE does not resolve, the goldens root is not
in a git work tree or cannot be read. ``--all`` also prints the workloads left out, marked
``not affected``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "list the golden workloads a change since BASE (a git revision) can affect"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._options import add_goldens_root

    parser.add_argument("base", metavar="BASE", help="git revision to compare the work tree with (e.g. origin/main)")
    add_goldens_root(parser, type=Path)
    parser.add_argument("--platform", default=None,
                        help="golden platform (default: $GOLDEN_PLATFORM, else each workload's host platform)")
    parser.add_argument("--all", action="store_true", help="also print the workloads that are not affected")


def run(args: argparse.Namespace) -> int:
    import os

    from harness.cli.lint import default_root
    from harness.footprint.affected import AffectedError, affected

    root = Path(args.goldens_root or default_root())
    if not root.is_dir():
        print(f"golden affected: goldens root {root} does not exist", file=sys.stderr)
        return 2
    try:
        selections = affected(args.base, root, args.platform or os.environ.get("GOLDEN_PLATFORM"))
    except (AffectedError, OSError) as exc:
        print(f"golden affected: {exc}", file=sys.stderr)
        return 2
    chosen = [s for s in selections if s.selected]
    for s in selections:
        if s.selected:
            print(f"{s.workload}\t{s.reason}")
        elif args.all:
            print(f"{s.workload}\tnot affected")
    print(f"golden affected: {len(chosen)} of {len(selections)} workload(s) affected since {args.base}",
          file=sys.stderr)
    return 0
