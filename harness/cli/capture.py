"""``golden capture WORKLOAD``: run + postflight, store the golden of a new platform."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._workload_args import add_workload_arguments

    add_workload_arguments(parser)
    parser.add_argument("--reason", default="initial capture", help="recorded in PROVENANCE.json")


def run(args: argparse.Namespace) -> int:
    import sys

    from harness import flows
    from harness.cli._workload_args import execute_or_explain

    execution, code = execute_or_explain(args)
    if execution is None:
        return code
    platform = flows.platform_of(execution.spec, args.platform)
    try:
        path = flows.store_golden(execution, platform, reason=args.reason, goldens_root=args.goldens,
                                  command="golden capture " + " ".join([args.workload, *args.overrides]),
                                  allow_replace=False)
    except (ValueError, FileExistsError) as exc:
        print(f"golden capture: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, FileExistsError) else 1
    print(f"golden written: {path}")
    return 0
