"""``golden doctor WORKLOAD``: do the configured plugins import in every worker environment?

Run before a workload: a plugin class that is missing from a worker's
environment would otherwise fail that worker at start-up. For the built-in
trace profilers it also parses their settings in ``plugins.env``
(``HARNESS_TRACE_OPERATORS`` / ``_OPERATOR_STEPS`` / ``_COLLECTIVES``). Exit 0
when every configured plugin imports and its settings parse, 1 when one does
not (with the install hint or the bad value), 2 for an unusable spec.
"""

from __future__ import annotations

import argparse
import sys

HELP = "check that configured plugins import in every worker environment"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="workload name under goldens/ or a path to workload.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value",
                        help="spec overrides, as for golden run (e.g. plugins.policy_profiler=null)")
    parser.add_argument(
        "--override", "-o", action="append", default=[], metavar="KEY=VALUE",
        help="spec override, e.g. plugins.policy_profiler=null (repeatable)",
    )
    from harness.cli._options import add_goldens_root

    add_goldens_root(parser, dest="goldens")


def run(args: argparse.Namespace) -> int:
    from harness.plugins.environments import check_plugins
    from harness.spec import SpecError, load_spec

    try:
        spec = load_spec(args.workload, [*args.overrides, *args.override], goldens_root=args.goldens)
    except (SpecError, OSError) as exc:
        print(f"golden doctor: {exc}", file=sys.stderr)
        return 2
    plugins = spec.get("plugins") or {}
    for key in ("policy_profiler", "rollout_profiler"):
        if not plugins.get(key):
            print(f"{key}: not configured (nothing to check)")
    failures = 0
    for check in check_plugins(spec):
        where = check.environment.label
        if check.ok:
            print(f"{check.environment.plugin_key}: {check.class_path} imports in the {where}: ok")
        else:
            failures += 1
            print(f"{check.environment.plugin_key}: {check.class_path} FAILS in the {where}: {check.error}")
            print(f"  hint: {check.hint}")
    failures += _check_trace_settings(plugins)
    return 1 if failures else 0


def _check_trace_settings(plugins: dict) -> int:
    """The built-in trace profilers read HARNESS_TRACE_* from ``plugins.env``: would they start?"""
    trace = [plugins.get(k) for k in ("policy_profiler", "rollout_profiler")
             if str(plugins.get(k) or "").startswith("harness.profiler.trace.")]
    if not trace:
        return 0
    from harness.profiler.phase import settings_problems

    problems = settings_problems(dict(plugins.get("env") or {}))
    for problem in problems:
        print(f"plugins.env: {problem} (the trace profilers would fail every worker at start)")
    if not problems:
        print("plugins.env: the trace profilers' settings parse: ok")
    return len(problems)
