"""``golden run WORKLOAD [key=value ...]``: run a workload and postflight it.

``golden run --resume RUN_DIR [--ray-address ADDR]`` continues a stopped run from its
newest checkpoint (written every ``grpo.checkpoint_every`` steps), on that Ray cluster
(else the run's ``platform.ray_address``, else a private local instance).

Exit 0 when the run completes (its directory is printed on stdout), 2 for
unusable input (spec, a non-empty --run-dir), 3 when the run does not
complete, 130 when interrupted.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._workload_args import add_workload_arguments

    add_workload_arguments(parser, workload_optional=True)
    parser.add_argument("--resume", metavar="RUN_DIR", default=None,
                        help="continue this run directory from its newest checkpoint")


def run(args: argparse.Namespace) -> int:
    import sys

    from harness.cli import EXIT_OK, EXIT_USAGE
    from harness.cli._workload_args import (
        execute_or_explain,
        progress,
        report_execution,
    )

    if args.resume:
        if args.workload or args.overrides:
            print("golden run --resume takes no workload or overrides (the run's own spec is used)", file=sys.stderr)
            return EXIT_USAGE
        from harness import flows
        from harness.docio import DocumentError
        from harness.spec.errors import SpecError

        try:
            with progress(args) as say:
                execution = flows.resume(args.resume, say=say, ray_address=getattr(args, "ray_address", None))
        except (FileNotFoundError, DocumentError, SpecError) as exc:  # also ClusterRefused, before anything starts
            print(f"golden run --resume: {exc}", file=sys.stderr)
            return EXIT_USAGE
        execution, code = report_execution(args, execution)
    else:
        if not args.workload:
            print("golden run: a WORKLOAD (or --resume RUN_DIR) is required", file=sys.stderr)
            return EXIT_USAGE
        execution, code = execute_or_explain(args)
    if execution is None:
        return code
    print(execution.run_dir)
    return EXIT_OK
