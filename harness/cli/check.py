"""``golden check WORKLOAD``: run + postflight + parity against the stored golden.

Exit 0 on parity, 1 on findings (a regression or a probable stale golden),
2 on unusable input (bad spec, no golden or a corrupt one for the platform,
unusable --run-dir/--output, an --output suffix that contradicts --format; all
checked before the run starts, and a refused check leaves no run directory),
3 when the run does not complete (no verdict), 130 when interrupted.

The report goes to stdout (or ``--output FILE``, its format from the suffix
unless ``--format`` says it); progress and the follow-up hint go to stderr.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._options import add_report_arguments
    from harness.cli._workload_args import add_workload_arguments

    add_workload_arguments(parser)
    add_report_arguments(parser)
    parser.add_argument(
        "--show-info", action="store_true", help="terminal: list informational (not gated) findings too"
    )


def _golden(prepared, args: argparse.Namespace):
    """The stored golden, tolerance table and lane mode; raises Refused (exit 2)."""
    from harness import flows
    from harness.cli._workload_args import Refused
    from harness.cli.hints import golden_command
    from harness.parity.tolerances import ToleranceFileError
    from harness.store.atomic import GoldenStoreError

    name, platform = prepared.spec.name, prepared.platform
    try:
        return flows.load_golden(prepared.goldens_root, name, platform)
    except flows.GoldenMissing:
        scheduled = list(prepared.spec.platform.platforms)
        if prepared.scheduled_platform not in scheduled:
            raise Refused(f"platform {platform!r} is not scheduled for {name} "
                          f"(platform.platforms = {scheduled}), so it has no golden") from None
        from harness.store.variants import mismatch_note

        hint = golden_command("capture", args.workload, overrides=args.overrides,
                              platform=prepared.scheduled_platform, goldens_root=args.goldens)
        raise Refused(f"no golden for workload {name!r} on platform {platform!r} in {prepared.goldens_root}"
                      f"{mismatch_note(prepared.goldens_root, name, platform)} (create it with: {hint})") from None
    except (GoldenStoreError, ToleranceFileError, ValueError) as exc:
        raise Refused(f"golden {name} [{platform}] is unusable: {exc}") from None


def _run_fields(run_dir) -> dict:
    """The run's id for the report's provenance block (``run.json``; empty when unreadable)."""
    import json

    try:
        doc = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"run_id": doc["run_id"]} if isinstance(doc, dict) and "run_id" in doc else {}


def run(args: argparse.Namespace) -> int:
    import sys

    from harness.cli._workload_args import (
        Refused,
        check_output_target,
        execute_or_explain,
        prepare,
        progress,
        resolve_report,
    )
    from harness.parity.comparison import compare

    try:
        resolve_report(args)
        prepared = prepare(args)
        golden, _, deterministic = _golden(prepared, args)  # refuse a missing or corrupt golden before running
        check_output_target(args.output, golden_dir=golden.path)
    except Refused as exc:
        print(f"golden check: {exc}", file=sys.stderr)
        return exc.code
    from harness import flows

    changed = flows.spec_difference(prepared.spec, golden)
    if changed is not None and changed.gating:  # decided before the run: the spec, not a surface, is what changed
        from harness.cli import EXIT_USAGE
        from harness.parity.findings import Verdict
        from harness.spec.errors import SpecError

        try:  # unusable input (exit 2) still comes first; a run's execute checks it itself
            flows.refuse_unrunnable(prepared.plan)
        except SpecError as exc:
            print(f"golden check: {exc}", file=sys.stderr)
            return EXIT_USAGE
        return _report(args, prepared, Verdict(deterministic=deterministic, surfaces={}, spec=changed), golden,
                       execution=None)
    from harness.postflight.read import RunRefused, load_run

    with progress(args) as say:
        execution, code = execute_or_explain(args, prepared, say=say)
        if execution is None:
            return code
        try:
            golden, table, deterministic = _golden(prepared, args)  # read again: it may have been refreshed
        except Refused as exc:
            say.close()
            print(f"golden check: {exc}", file=sys.stderr)
            return exc.code
        try:  # the run as written: manifest validated first, paths confined, complete only
            documents = load_run(execution.run_dir)
        except RunRefused as exc:
            say.close()
            print(f"golden check: {exc}", file=sys.stderr)
            return exc.code
        say.phase("compare")
        actual = documents.surfaces
        verdict = compare(golden.surfaces, actual, tolerances=table, deterministic=deterministic,
                          lane_source=table.lane_source)
        from harness.parity.spec_check import run_against_golden

        verdict.spec = run_against_golden(documents.manifest, (documents.run or {}).get("spec"), golden.manifest,
                                          golden.provenance)
    return _report(args, prepared, verdict, golden, execution=execution, actual=actual)


def _report(args: argparse.Namespace, prepared, verdict, golden, *, execution, actual: dict | None = None) -> int:
    """Print (or write to ``--output``) the report of ``verdict``; the refresh hint when it fails.
    ``execution`` None: a verdict decided before any run (the spec differs from the golden's)."""
    import sys

    from harness.cli import EXIT_FINDINGS, EXIT_OK
    from harness.cli._workload_args import write_report
    from harness.cli.hints import golden_command
    from harness.parity.render import render
    from harness.parity.render.common import summary_line
    from harness.parity.step_times import step_times

    platform = prepared.platform
    actual = actual or {}
    curves = {}
    if args.format == "html" and execution is not None:  # the HTML report plots golden vs actual training curves
        curves = {"surfaces_actual": actual, "surfaces_golden": golden.surfaces,
                  "run": _run_fields(execution.run_dir)}
    title = f"{prepared.spec.name} [{platform}]"
    report = render(verdict, args.format, title=title, color=False if args.output else None,
                    show_info=args.show_info, provenance=golden.provenance,
                    step_times=step_times(golden.surfaces.get("timings"), actual.get("timings")), **curves)
    if args.output:  # as golden diff: the report to the file, one line to the log
        write_report(args.output, report + "\n")
        print(f"{title}: {summary_line(verdict)} (report: {args.output})")
    else:
        print(report)
    if execution is None:
        print(f"check {prepared.spec.name} [{platform}]: {verdict.status} before any run: the workload spec is not "
              "the golden's", file=sys.stderr)
    else:
        print(f"check {execution.spec.name} [{platform}]: {verdict.status} "
              f"(wall {execution.wall_s:.1f}s; run dir {execution.run_dir})", file=sys.stderr)
    if not verdict.ok:
        from harness.flows import numerics_key_of
        from harness.store.variants import unrecorded_note

        hint = golden_command("refresh", args.workload, overrides=args.overrides, platform=platform,
                              goldens_root=args.goldens, reason=True)
        print(f"  if the change is intended: {hint}", file=sys.stderr)
        note = unrecorded_note(prepared.goldens_root, prepared.spec.name, platform, numerics_key_of(prepared.spec))
        if note and execution is not None:  # about surface differences: none were compared
            print(f"  {note}", file=sys.stderr)
        return EXIT_FINDINGS
    return EXIT_OK
