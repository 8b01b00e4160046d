"""``golden check WORKLOAD``: run + postflight + parity against the stored golden.

Exit 0 on parity, 1 on findings (a regression or a probable stale golden),
2 on unusable input (bad spec, no golden or a corrupt one for the platform,
unusable --run-dir/--output; all checked before the run starts), 3 when the
run does not complete (no verdict), 130 when interrupted.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._workload_args import add_workload_arguments

    add_workload_arguments(parser)
    parser.add_argument("--format", choices=("terminal", "markdown", "json", "junit", "html"), default="terminal")
    parser.add_argument("--output", default=None,
                        help="write the report here instead of stdout (stdout then gets one summary line)")
    parser.add_argument(
        "--show-info", action="store_true", help="terminal: list informational (not gated) findings too"
    )


def _golden(prepared):
    """The stored golden, tolerance table and lane mode; raises Refused (exit 2)."""
    from harness import flows
    from harness.cli._workload_args import Refused
    from harness.parity.tolerances import ToleranceFileError
    from harness.store.atomic import GoldenStoreError

    try:
        return flows.load_golden(prepared.goldens_root, prepared.spec["name"], prepared.platform)
    except flows.GoldenMissing as exc:
        scheduled = prepared.spec["platform"]["platforms"]
        if prepared.platform not in scheduled:
            raise Refused(f"platform {prepared.platform!r} is not scheduled for {prepared.spec['name']} "
                          f"(platform.platforms = {scheduled}), so it has no golden") from None
        raise Refused(str(exc)) from None
    except (GoldenStoreError, ToleranceFileError, ValueError) as exc:
        raise Refused(f"golden {prepared.spec['name']} [{prepared.platform}] is unusable: {exc}") from None


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from harness.cli import EXIT_FINDINGS, EXIT_OK
    from harness.cli._workload_args import (
        Refused,
        check_output_path,
        execute_or_explain,
        prepare,
    )
    from harness.parity.engine import compare
    from harness.parity.render import render
    from harness.parity.render.common import summary_line

    try:
        check_output_path(args.output)
        prepared = prepare(args)
        _golden(prepared)  # refuse a missing or corrupt golden before running for a minute
    except Refused as exc:
        print(f"golden check: {exc}", file=sys.stderr)
        return exc.code
    execution, code = execute_or_explain(args, prepared)
    if execution is None:
        return code
    platform = prepared.platform
    try:
        golden, table, deterministic = _golden(prepared)  # read again: it may have been refreshed meanwhile
    except Refused as exc:
        print(f"golden check: {exc}", file=sys.stderr)
        return exc.code
    from harness.postflight.read import RunRefused, load_run

    try:  # the run as written: manifest validated first, paths confined, complete only
        actual = load_run(execution.run_dir).surfaces
    except RunRefused as exc:
        print(f"golden check: {exc}", file=sys.stderr)
        return exc.code
    verdict = compare(golden.surfaces, actual, tolerances=table, deterministic=deterministic)
    curves = {}
    if args.format == "html":  # the HTML report plots golden vs actual training curves
        curves = {"surfaces_actual": actual, "surfaces_golden": golden.surfaces}
    title = f"{execution.spec['name']} [{platform}]"
    report = render(verdict, args.format, title=title, color=False if args.output else None,
                    show_info=args.show_info, **curves)
    if args.output:  # as golden diff: the report to the file, one line to the log
        Path(args.output).write_text(report + "\n")
        print(f"{title}: {summary_line(verdict)} (report: {args.output})")
    else:
        print(report)
    print(f"check {execution.spec['name']} [{platform}]: {verdict.status} "
          f"(wall {execution.wall_s:.1f}s; run dir {execution.run_dir})", file=sys.stderr)
    if not verdict.ok:
        print(f"  if the change is intended: golden refresh {execution.spec['name']} --platform {platform} "
              "--reason TEXT", file=sys.stderr)
        return EXIT_FINDINGS
    return EXIT_OK
