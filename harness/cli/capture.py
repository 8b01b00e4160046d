"""``golden capture WORKLOAD``: run + postflight, store the golden of a new platform.

Refused before anything runs (exit 2) when the platform is not scheduled in
the spec's ``platform.platforms`` or a golden for it already exists (use
``golden refresh``). Exit 3 when the run does not complete (nothing is
stored), 130 when interrupted (nothing is stored; the store is atomic).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._workload_args import add_workload_arguments

    add_workload_arguments(parser)
    parser.add_argument("--reason", default="initial capture", help="recorded in PROVENANCE.json")
    add_allow_dirty(parser)


def add_allow_dirty(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-dirty", action="store_true",
                        help="store even with uncommitted changes outside the goldens root (their digest is "
                             "recorded in PROVENANCE.json); refused otherwise")


def check_storable(prepared, *, allow_replace: bool, args: argparse.Namespace | None = None) -> None:
    """Refuse (exit 2) what store_golden would refuse after the run: an
    unscheduled platform, for a capture an existing golden, uncommitted changes outside the
    goldens root (without ``--allow-dirty``), and for a refresh an invalid tolerances.yaml
    (it would be carried over verbatim)."""
    from harness.cli._workload_args import Refused
    from harness.store.layout import golden_dir

    spec, platform = prepared.spec, prepared.store_platform
    if prepared.scheduled_platform not in spec.platform.platforms:
        raise Refused(f"platform {platform!r} is not scheduled for {spec.name} "
                      f"(platform.platforms = {list(spec.platform.platforms)})")
    try:
        target = golden_dir(prepared.goldens_root, spec.name, platform)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    if not allow_replace and target.exists():
        from harness.cli.hints import golden_command

        hint = golden_command("refresh", args.workload if args else spec.name,
                              overrides=args.overrides if args else (), platform=prepared.scheduled_platform,
                              goldens_root=args.goldens if args else None, reason=True)
        raise Refused(f"{target} exists; to replace it: {hint}")
    if not getattr(args, "allow_dirty", False):
        from harness.store.provenance import dirty_refusal, uncommitted_changes

        changes = uncommitted_changes(prepared.goldens_root)
        if changes is not None:
            raise Refused(dirty_refusal(changes))
    tolerances = target / "tolerances.yaml"
    if allow_replace and tolerances.is_file():  # refresh carries it into the new golden verbatim
        from harness.parity.tolerances import ToleranceFileError, load_tolerances

        try:
            load_tolerances(tolerances)
        except ToleranceFileError as exc:
            raise Refused(f"{exc}\n  refresh keeps the declared tolerances.yaml in the new golden: "
                          f"fix {tolerances} first") from None


def run_to_store(args: argparse.Namespace, command: str, *, allow_replace: bool):
    """What capture and refresh share before storing: a reason, every refusal that can come
    before the run (exit 2), then the run. ``(prepared, execution, None)``, or
    ``(None, None, exit code)`` when there is nothing to store."""
    import sys

    from harness.cli import EXIT_USAGE
    from harness.cli._workload_args import Refused, execute_or_explain, prepare

    if not (args.reason or "").strip():
        print(f"golden {command}: --reason TEXT must not be empty (it is recorded in PROVENANCE.json)",
              file=sys.stderr)
        return None, None, EXIT_USAGE
    try:
        prepared = prepare(args)
        check_storable(prepared, allow_replace=allow_replace, args=args)
    except Refused as exc:
        print(f"golden {command}: {exc}", file=sys.stderr)
        return None, None, exc.code
    execution, code = execute_or_explain(args, prepared)
    if execution is None:
        return None, None, code
    return prepared, execution, None


def run(args: argparse.Namespace) -> int:
    import sys

    from harness import flows
    from harness.cli import EXIT_NO_VERDICT, EXIT_USAGE

    prepared, execution, code = run_to_store(args, "capture", allow_replace=False)
    if execution is None:
        return code
    try:
        path = flows.store_golden(execution, prepared.store_platform, reason=args.reason,
                                  goldens_root=prepared.goldens_root,
                                  command="golden capture " + " ".join([args.workload, *args.overrides]),
                                  allow_replace=False, allow_dirty=args.allow_dirty)
    except FileExistsError as exc:  # captured by someone else during the run
        print(f"golden capture: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, OSError) as exc:
        print(f"golden capture: nothing stored: {exc}", file=sys.stderr)
        return EXIT_NO_VERDICT
    print(f"golden written: {path}")
    return 0
