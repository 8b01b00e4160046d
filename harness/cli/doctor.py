"""``golden doctor WORKLOAD``: do the configured plugins import in every worker environment?

Run before a workload: a plugin class that is missing from a worker's
environment would otherwise fail that worker at start-up. For the built-in
trace profilers it also parses their settings in ``plugins.env``
(``HARNESS_TRACE_OPERATORS`` / ``_OPERATOR_STEPS`` / ``_COLLECTIVES``). It also
says which stored golden a check on this machine compares with (for a CPU workload,
this machine's CPU numerics key and its variant, ``harness.store.variants``), or
that there is none for this machine. Exit 0 when every configured plugin imports,
its settings parse and the golden is there, 1 when one is not (with the install
hint, the bad value or the capture command), 2 for an unusable spec.

Worker environments (docs/worker-envs.md): ``golden doctor WORKLOAD --worker-env
auto|DIR`` runs those checks in the environments the workload's workers would
start in, plus, per environment, the backend's imports and the smoke check (one
tiny step, ``harness.workerenv.smoke``). ``golden doctor --envs`` (no workload)
checks every built environment of the cache with the built-in trace profilers;
one that is not built is listed, not failed; a stale or broken one fails.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.spec.typed import PluginsSpec, Workload

HELP = "check that configured plugins import in every worker environment"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", nargs="?", help="workload name under goldens/ or a path to workload.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value",
                        help="spec overrides, as for golden run (e.g. plugins.policy_profiler=null)")
    parser.add_argument(
        "--override", "-o", action="append", default=[], metavar="KEY=VALUE",
        help="spec override, e.g. plugins.policy_profiler=null (repeatable)",
    )
    parser.add_argument("--worker-env", default=None, metavar="current|auto|DIR",
                        help="check in the workers' built environments (as golden run --worker-env)")
    parser.add_argument("--envs", action="store_true",
                        help="check every built worker environment (backend imports, plugins, smoke step)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR", help="worker-environment cache (with --envs)")
    parser.add_argument("--no-smoke", action="store_true", help="skip the per-environment smoke step")
    from harness.cli._options import add_goldens_root

    add_goldens_root(parser, dest="goldens")


def run(args: argparse.Namespace) -> int:
    from harness.plugins.environments import check_plugins
    from harness.spec import SpecError, load_spec

    if args.envs:
        return _check_all_envs(args)
    if not args.workload:
        print("golden doctor: a WORKLOAD (or --envs) is required", file=sys.stderr)
        return 2
    try:
        spec = load_spec(args.workload, [*args.overrides, *args.override], goldens_root=args.goldens)
    except (SpecError, OSError) as exc:
        print(f"golden doctor: {exc}", file=sys.stderr)
        return 2
    plugins = spec.plugins
    from harness.workerenv.select import CURRENT, selection

    if selection(args.worker_env) != CURRENT:
        return _check_workload_envs(args, spec, plugins)
    for key in ("policy_profiler", "rollout_profiler"):
        if not getattr(plugins, key):
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
    failures += _check_golden(spec, args)
    return 1 if failures else 0


def _check_golden(spec: Workload, args: argparse.Namespace) -> int:
    """One line: the stored golden ``golden check`` would compare with on this machine; 1 when none."""
    from harness import flows
    from harness.spec.roots import resolve_goldens_root
    from harness.store.layout import golden_dir
    from harness.store.variants import mismatch_note

    try:
        root = resolve_goldens_root(args.goldens)
        platform = flows.platform_of(spec)
        stored = flows.stored_platform(spec, platform, root)
    except Exception as exc:  # noqa: BLE001 - a doctor reports, it does not crash
        print(f"golden: cannot tell which golden applies: {exc}")
        return 1
    key = flows.numerics_key_of(spec)
    numerics = f" (this machine's CPU numerics: {key})" if key else ""
    if (golden_dir(root, spec.name, stored) / "manifest.json").is_file():
        print(f"golden: {spec.name} [{stored}] in {root}{numerics}: ok")
        return 0
    if platform not in spec.platform.platforms:
        print(f"golden: {spec.name} does not schedule platform {platform!r} (nothing to compare on this host)")
        return 0
    print(f"golden: {spec.name} [{stored}] is MISSING in {root}{numerics}"
          f"{mismatch_note(root, spec.name, stored)}")
    print(f"  hint: golden capture {spec.name} --platform {platform} --reason TEXT")
    return 1


def _print_env(backend: str, lines) -> int:
    print(f"[{backend}]")
    for line in lines:
        print(f"  {line.text}")
    return sum(not line.ok for line in lines)


def _check_all_envs(args: argparse.Namespace) -> int:
    from harness.workerenv import declare, stamp
    from harness.workerenv.checks import check_environment

    try:
        cache = stamp.cache_dir(args.cache_dir)
    except declare.WorkerEnvError as exc:
        print(f"golden doctor: {exc}", file=sys.stderr)
        return 2
    print(f"worker environments in {cache}")
    failures = 0
    for backend in declare.ENVIRONMENTS:
        if stamp.inspect(cache, backend, verify=False).status == "missing":
            print(f"[{backend}]\n  not built (golden env build {backend})")
            continue
        failures += _print_env(backend, check_environment(cache, backend, run_smoke=not args.no_smoke))
    return 1 if failures else 0


def _check_workload_envs(args: argparse.Namespace, spec: Workload, plugins: PluginsSpec) -> int:
    """The workload's plugins, backend imports and smoke step in the environments its workers use."""
    from harness.workerenv import declare
    from harness.workerenv.checks import check_environment
    from harness.workerenv.select import cache_of, selection, worker_pythons

    try:
        chosen = selection(args.worker_env)
        worker_pythons(spec, chosen)  # refuses a missing / broken environment, naming the backend
        cache = cache_of(chosen)
    except declare.WorkerEnvError as exc:
        print(f"golden doctor: {exc}", file=sys.stderr)
        return 2
    per_env: dict[str, dict[str, str | None]] = {}
    for role, backend in declare.backends_of(spec).items():
        per_env.setdefault(backend, {})[role] = getattr(plugins, f"{role}_profiler")
    failures = sum(_print_env(backend, check_environment(cache, backend, roles, run_smoke=not args.no_smoke))
                   for backend, roles in per_env.items())
    failures += _check_trace_settings(plugins)
    failures += _check_golden(spec, args)
    return 1 if failures else 0


def _check_trace_settings(plugins: PluginsSpec) -> int:
    """The built-in trace profilers read HARNESS_TRACE_* from ``plugins.env``: would they start?"""
    trace = [path for path in (plugins.policy_profiler, plugins.rollout_profiler)
             if str(path or "").startswith("harness.profiler.trace.")]
    if not trace:
        return 0
    from harness.profiler.phase import settings_problems

    problems = settings_problems(dict(plugins.env))
    for problem in problems:
        print(f"plugins.env: {problem} (the trace profilers would fail every worker at start)")
    if not problems:
        print("plugins.env: the trace profilers' settings parse: ok")
    return len(problems)
