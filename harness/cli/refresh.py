"""``golden refresh WORKLOAD --reason TEXT``: show the diff, then rewrite the golden.

Refused before anything runs (exit 2) without a reason or for a platform the
spec does not schedule. The old golden stays intact until the new one is
completely written (atomic swap); a run that does not complete stores nothing
(exit 3, or 130 when interrupted).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._workload_args import add_workload_arguments

    add_workload_arguments(parser)
    parser.add_argument("--reason", default=None, help="why the golden changes (required)")
    from harness.cli.capture import add_allow_dirty

    add_allow_dirty(parser)
    parser.add_argument("--numerics-variant", action="store_true",
                        help="on the CPU, store the run as this machine's CPU-numerics variant "
                             "(<platform>@<key>) beside a golden that records no CPU numerics, instead of "
                             "replacing it (docs/gate.md, CPU numerics)")


def run(args: argparse.Namespace) -> int:
    import sys

    from harness import flows
    from harness.cli import EXIT_NO_VERDICT
    from harness.cli.capture import run_to_store
    from harness.parity.render import render
    from harness.parity.tolerances import ToleranceFileError
    from harness.store.atomic import GoldenStoreError

    prepared, execution, code = run_to_store(args, "refresh", allow_replace=True)
    if execution is None:
        return code
    platform = prepared.platform
    try:
        verdict = flows.compare_with_golden(execution, platform, prepared.goldens_root)
        print(render(verdict, "terminal", title=f"{execution.spec.name} [{platform}] before refresh"))
    except flows.GoldenMissing:
        print(f"no current golden for {execution.spec.name} [{platform}]; writing a new one", file=sys.stderr)
    except (GoldenStoreError, ToleranceFileError) as exc:  # a corrupt golden is what refresh repairs
        print(f"current golden unreadable ({exc}); replacing it", file=sys.stderr)
    if prepared.store_platform != platform:  # a new variant beside the golden compared: none may exist yet
        print(f"storing {execution.spec.name} [{prepared.store_platform}] beside [{platform}]", file=sys.stderr)
        flows.remember_golden(execution, None)
    try:
        path = flows.store_golden(execution, prepared.store_platform, reason=args.reason,
                                  goldens_root=prepared.goldens_root,
                                  command="golden refresh " + " ".join([args.workload, *args.overrides]),
                                  allow_replace=True, allow_dirty=args.allow_dirty)
    except (ValueError, OSError) as exc:
        print(f"golden refresh: nothing stored: {exc}", file=sys.stderr)
        return EXIT_NO_VERDICT
    print(f"golden rewritten: {path}")
    return 0
