"""Arguments shared by the commands that run a workload (run, check, capture, refresh)."""

from __future__ import annotations

import argparse
import sys


def add_workload_arguments(parser: argparse.ArgumentParser, *, workload_optional: bool = False) -> None:
    parser.add_argument("workload", nargs="?" if workload_optional else None,
                        help="workload name (goldens/<name>/workload.yaml) or path to a workload.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="spec overrides")
    parser.add_argument("--run-dir", default=None, help="run directory (default: runs/<workload>-<time>-<pid>)")
    parser.add_argument("--goldens", default=None, help="goldens root (default: the repository's goldens/)")
    parser.add_argument("--platform", default=None, help="golden platform (default: $GOLDEN_PLATFORM or spec device)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def progress(args: argparse.Namespace):
    if args.quiet:
        return None

    def say(msg: str) -> None:
        print(f"[golden] {msg}", file=sys.stderr, flush=True)

    return say


def execute_or_explain(args: argparse.Namespace):
    """Run + postflight; ``(execution, None)`` or ``(None, exit_code)`` with the reason printed."""
    from harness import flows
    from harness.spec.errors import SpecError

    say = progress(args)
    try:
        execution = flows.execute(args.workload, overrides=tuple(args.overrides), run_dir=args.run_dir,
                                  goldens_root=args.goldens, say=say, platform=getattr(args, "platform", None))
    except SpecError as exc:
        print(f"golden: {exc}", file=sys.stderr)
        return None, 2
    except ModuleNotFoundError as exc:
        print(f"golden: the workload half is not installed ({exc}); run ci/bootstrap.sh", file=sys.stderr)
        return None, 2
    status = execution.postflight.status
    print(f"run {execution.run_dir}: {status} in {execution.wall_s:.1f}s", file=sys.stderr)
    for problem in execution.problems():
        print(f"  FAIL {problem}", file=sys.stderr)
    return execution, None
