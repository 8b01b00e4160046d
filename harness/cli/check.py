"""``golden check WORKLOAD``: run + postflight + parity against the stored golden.

Exit 0 on parity, 1 on findings or an incomplete run, 2 on unusable input
(bad spec, no golden for the platform).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._workload_args import add_workload_arguments

    add_workload_arguments(parser)
    parser.add_argument("--format", choices=("terminal", "markdown", "json", "junit", "html"), default="terminal")
    parser.add_argument("--output", default=None, help="also write the report here")
    parser.add_argument("--show-info", action="store_true", help="terminal: list informational (not gated) findings too")


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from harness import flows
    from harness.cli._workload_args import execute_or_explain
    from harness.parity.render import render

    execution, code = execute_or_explain(args)
    if execution is None:
        return code
    if not execution.ok:
        return 1
    platform = flows.platform_of(execution.spec, args.platform)
    try:
        verdict = flows.compare_with_golden(execution, platform, args.goldens)
    except flows.GoldenMissing as exc:
        print(f"golden: {exc}", file=sys.stderr)
        return 2
    curves = {}
    if args.format == "html":  # the HTML report plots golden vs actual training curves
        root = Path(args.goldens or flows.default_goldens_root())
        golden = flows.load_golden(root, execution.spec["name"], platform)[0]
        curves = {"surfaces_actual": execution.postflight.surfaces, "surfaces_golden": golden.surfaces}
    report = render(verdict, args.format, title=f"{execution.spec['name']} [{platform}]", show_info=args.show_info, **curves)
    print(report)
    if args.output:
        Path(args.output).write_text(report + "\n")
    print(f"check {execution.spec['name']} [{platform}]: {verdict.status} "
          f"(wall {execution.wall_s:.1f}s)", file=sys.stderr)
    return 0 if verdict.ok else 1
