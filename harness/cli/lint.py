"""``golden lint``: scheduled workload x platform pairs vs stored goldens.

Exit 0 when clean, 1 on findings, 2 when the goldens root does not exist.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "check that scheduled workloads and stored goldens match"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._options import add_goldens_root

    add_goldens_root(parser, type=Path)


def default_root() -> Path:
    try:
        from harness.spec import default_goldens_root
    except ImportError:
        return Path("goldens")
    return Path(default_goldens_root())


def run(args: argparse.Namespace) -> int:
    from harness.store.lint import lint

    try:
        root = args.goldens_root or default_root()
    except ValueError as exc:  # a bad [tool.golden] table in pyproject.toml (SpecError)
        print(f"golden lint: {exc}", file=sys.stderr)
        return 2
    try:
        findings = lint(root)
    except FileNotFoundError as exc:
        print(f"golden lint: {exc}", file=sys.stderr)
        return 2
    for finding in findings:
        print(finding)
    if findings:
        print(f"golden lint: {len(findings)} finding(s) under {root}", file=sys.stderr)
        return 1
    print(f"ok: {root}: every scheduled workload x platform has a golden and every golden is scheduled")
    return 0
