"""``golden refresh WORKLOAD --reason TEXT``: show the diff, then rewrite the golden.

A refresh without a reason is refused before anything runs. The old golden
stays intact until the new one is completely written (atomic swap).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._workload_args import add_workload_arguments

    add_workload_arguments(parser)
    parser.add_argument("--reason", default=None, help="why the golden changes (required)")


def run(args: argparse.Namespace) -> int:
    import sys

    from harness import flows
    from harness.cli._workload_args import execute_or_explain
    from harness.parity.render import render

    if not (args.reason or "").strip():
        print("golden refresh: --reason TEXT is required (it is recorded in PROVENANCE.json)", file=sys.stderr)
        return 2
    execution, code = execute_or_explain(args)
    if execution is None:
        return code
    platform = flows.platform_of(execution.spec, args.platform)
    try:
        verdict = flows.compare_with_golden(execution, platform, args.goldens)
        print(render(verdict, "terminal", title=f"{execution.spec['name']} [{platform}] before refresh"))
    except flows.GoldenMissing:
        print(f"no current golden for {execution.spec['name']} [{platform}]; writing a new one", file=sys.stderr)
    try:
        path = flows.store_golden(execution, platform, reason=args.reason, goldens_root=args.goldens,
                                  command="golden refresh " + " ".join([args.workload, *args.overrides]),
                                  allow_replace=True)
    except ValueError as exc:
        print(f"golden refresh: {exc}", file=sys.stderr)
        return 1
    print(f"golden rewritten: {path}")
    return 0
