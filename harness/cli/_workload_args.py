"""Arguments and checks shared by the commands that run a workload (run, check, capture, refresh).

Everything a command can refuse for is checked *before* the workload starts
(spec, platform, run directory, report path, the golden it needs or must not
find), so a usage error costs milliseconds, not a run. Exit codes are
``harness.cli.EXIT_*``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli._options import add_goldens_root

if TYPE_CHECKING:
    from harness.spec.runplan import RunPlan
    from harness.spec.typed import Workload


class Refused(Exception):
    """A command cannot proceed; ``code`` is its exit code, the message says why."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def add_workload_arguments(parser: argparse.ArgumentParser, *, workload_optional: bool = False) -> None:
    parser.add_argument("workload", nargs="?" if workload_optional else None,
                        help="workload name (goldens/<name>/workload.yaml) or path to a workload.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="spec overrides")
    parser.add_argument("--run-dir", default=None,
                        help="run directory, must be absent or empty (default: <workload>-<time>-<pid> under "
                             "$GOLDEN_RUNS, else ~/.cache/grpo-golden-harness/runs; announced when the run starts)")
    add_goldens_root(parser, dest="goldens")
    parser.add_argument("--platform", default=None, help="golden platform (default: $GOLDEN_PLATFORM or spec device)")
    parser.add_argument("--ray-address", default=None, metavar="ADDR",
                        help="join this Ray cluster (e.g. head:6379) instead of starting a private local instance "
                             "(default: the spec's platform.ray_address, else local; RAY_ADDRESS is not followed); "
                             "a cluster that cannot hold the plan is refused before anything starts "
                             "(docs/cluster.md)")
    parser.add_argument("--option", action="append", default=[], metavar="FIELD=VALUE", dest="run_options",
                        help="a run option, part of the plan (worker_logs, cuda_graphs, decode_kernels, grouped_fp32, "
                             "collective_timeout_s; docs/spec.md, \"The run plan\"); repeatable")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--worker-env", default=None, metavar="current|auto|DIR",
                        help="interpreter of the policy/rollout workers: current (default), auto (each backend's "
                             "environment built by `golden env build`) or a cache DIR of built environments "
                             "(env GOLDEN_WORKER_ENV)")


def progress(args: argparse.Namespace):
    """The command's progress reporter on stderr (``harness.progress``): silent with ``-q``, a live
    display on a terminal, timestamped lines with a heartbeat elsewhere. Close it before printing
    the report."""
    from harness.progress import make_progress

    return make_progress(quiet=bool(getattr(args, "quiet", False)))


@dataclass
class Prepared:
    """What a workload command resolved before starting anything."""

    plan: RunPlan  # harness.spec.runplan: the run worked out once, every spec check made
    platform: str  # the stored golden compared with: the platform or its CPU-numerics variant
    goldens_root: Path
    run_dir: Path
    store_platform: str = ""  # the stored golden a capture/refresh writes (flows.stored_platform)

    @property
    def spec(self) -> Workload:
        """The plan's typed workload."""
        return self.plan.workload

    @property
    def scheduled_platform(self) -> str:
        """The platform as ``platform.platforms`` names it (without a ``@<key>`` qualifier)."""
        from harness.store.variants import base_platform

        return base_platform(self.platform)


def prepare(args: argparse.Namespace) -> Prepared:
    """Load the spec for the platform and claim the run directory; raises Refused (exit 2)."""
    from harness import flows
    from harness.spec.errors import SpecError
    from harness.spec.roots import resolve_goldens_root

    with _worker_env_selected(getattr(args, "worker_env", None)) as chosen:
        try:
            root = resolve_goldens_root(args.goldens)
            run_plan = flows.plan_run(args.workload, tuple(args.overrides), platform=args.platform,
                                      goldens_root=root, ray_address=getattr(args, "ray_address", None),
                                      options=tuple(getattr(args, "run_options", None) or ()))
        except SpecError as exc:
            raise Refused(str(exc)) from None
        spec = run_plan.workload
        _check_worker_env(spec, chosen)
    platform = flows.platform_of(spec, args.platform)
    try:
        stored = flows.stored_platform(spec, platform, root)
        store = flows.stored_platform(spec, platform, root, write=True,
                                      beside=bool(getattr(args, "numerics_variant", False)))
    except ValueError as exc:  # a platform name the store refuses
        raise Refused(str(exc)) from None
    run_dir = Path(args.run_dir) if args.run_dir else flows.default_run_dir(spec.name)
    claim_run_dir(run_dir)
    return Prepared(run_plan, stored, root, run_dir, store)


@contextmanager
def _worker_env_selected(value: str | None) -> Iterator[str]:
    """The worker-environment selection (``--worker-env``, else ``GOLDEN_WORKER_ENV``) carried to the
    backend check and the runner in ``GOLDEN_WORKER_ENV``; put back as it was when the command is refused."""
    from harness.workerenv.select import SELECT_ENV, selection

    previous = os.environ.get(SELECT_ENV)
    chosen = selection(value)
    os.environ[SELECT_ENV] = chosen
    try:
        yield chosen
    except BaseException:
        if previous is None:
            os.environ.pop(SELECT_ENV, None)
        else:
            os.environ[SELECT_ENV] = previous
        raise


def _check_worker_env(spec: dict, chosen: str) -> None:
    """Refuse (exit 2) a selected worker environment that is not built or not usable, naming the
    backend and the build command."""
    from harness.workerenv.declare import WorkerEnvError
    from harness.workerenv.select import worker_pythons

    try:
        worker_pythons(spec, chosen)
    except WorkerEnvError as exc:
        raise Refused(str(exc)) from None


def _creatable(path: Path, what: str) -> None:
    """``path`` (absent) could be created: its nearest existing ancestor is a writable directory.
    Checks only; nothing is created, so a refused command leaves no folder behind."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise Refused(f"{what}: cannot create it: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise Refused(f"{what}: cannot create it: {probe} is not writable")


def claim_run_dir(run_dir: Path) -> None:
    """The run directory must be absent or an empty directory we can create files in.

    Nothing is created here (the runner creates it when the workload starts), so a
    command refused after this check leaves no empty ``runs/...`` folder."""
    if run_dir.exists() and not run_dir.is_dir():
        raise Refused(f"--run-dir {run_dir}: exists and is not a directory")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise Refused(f"--run-dir {run_dir}: not empty (a run directory holds exactly one run; "
                      "use golden run --resume to continue one)")
    if run_dir.is_dir():
        if not os.access(run_dir, os.W_OK | os.X_OK):
            raise Refused(f"--run-dir {run_dir}: not writable")
        return
    _creatable(run_dir, f"--run-dir {run_dir}")


def check_output_path(path: str | None) -> None:
    """A report path must be a file we can write (checked before a run, not after; nothing is created)."""
    if not path:
        return
    out = Path(path)
    if out.is_dir():
        raise Refused(f"--output {out}: is a directory")
    if out.parent.exists() and not out.parent.is_dir():
        raise Refused(f"--output {out}: {out.parent} is not a directory")
    if not out.parent.exists():
        _creatable(out.parent, f"--output {out}")
        return
    if not os.access(out.parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise Refused(f"--output {out}: not writable")


def resolve_report(args: argparse.Namespace) -> None:
    """Check ``--output`` and settle ``args.format`` (from the suffix when not given); raises Refused."""
    from harness.cli._options import report_format

    check_output_path(str(args.output) if args.output else None)
    try:
        args.format = report_format(args.format, args.output)
    except ValueError as exc:
        raise Refused(str(exc)) from None


def check_output_target(path: str | Path | None, *, golden_dir: Path | None = None,
                        inputs: tuple[Path, ...] = ()) -> None:
    """A report must not land in what is compared: anywhere inside the golden directory
    (a report there would damage the golden, or be refused as a file the store never
    writes) or on one of the run's files (``inputs``: manifest, run.json, listed files).
    Raises Refused (nothing written)."""
    if not path:
        return
    out = Path(os.path.realpath(path))
    if golden_dir is not None:
        gold = Path(os.path.realpath(golden_dir))
        if out == gold or gold in out.parents:
            raise Refused(f"--output {path}: is inside the golden {golden_dir}; a report is never written into a "
                          "golden (write it elsewhere)")
    for item in inputs:
        if out == Path(os.path.realpath(item)):
            raise Refused(f"--output {path}: is {item}, a file this comparison reads; write the report elsewhere")


def write_report(path: str | Path, text: str) -> None:
    """Write a report file, creating its folder (checked by check_output_path before the run).
    Written beside the target and renamed over it, so a failed write leaves no half report."""
    import tempfile

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # as a plain write would leave it (mkstemp makes it 0600)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def run_error(run_dir: Path) -> str | None:
    """The runner's recorded error (``run.json`` ``error``), None when absent."""
    try:
        return json.loads((Path(run_dir) / "run.json").read_text()).get("error")
    except (OSError, ValueError, AttributeError):
        return None


def execute_or_explain(args: argparse.Namespace, prepared: Prepared | None = None, say=None):
    """Run + postflight; ``(execution, None)``, or ``(None, exit_code)`` with the reason printed.

    ``say``: the caller's progress reporter, left open for what the caller does next
    (check: compare); without one, a reporter is opened and closed here.
    A run that did not complete gives exit 3 (no verdict; the failed checks are
    printed), 130 when it was interrupted (Ctrl-C, SIGTERM)."""
    from harness import flows
    from harness.cli import EXIT_NO_VERDICT, EXIT_USAGE
    from harness.portable.drift import Drift
    from harness.spec.errors import SpecError

    try:
        prepared = prepared or prepare(args)
    except Refused as exc:
        print(f"golden {args.command}: {exc}", file=sys.stderr)
        return None, exc.code
    own = say is None
    if getattr(args, "run_dir", None):
        chosen = "--run-dir"
    elif os.environ.get(flows.RUNS_ENV, "").strip():
        chosen = f"under ${flows.RUNS_ENV}"
    else:
        chosen = f"the default place; --run-dir or ${flows.RUNS_ENV} choose another"
    print(f"golden {args.command}: run directory {prepared.run_dir} ({chosen})", file=sys.stderr)
    say = say if say is not None else progress(args)
    try:
        execution = flows.execute(args.workload, overrides=tuple(args.overrides), run_dir=prepared.run_dir,
                                  goldens_root=args.goldens, say=say, platform=getattr(args, "platform", None),
                                  ray_address=getattr(args, "ray_address", None),
                                  canary="store" if args.command in ("capture", "refresh") else "check",
                                  plan=prepared.plan)
    except Drift as exc:
        say.close()
        print(f"golden {args.command}: {exc}", file=sys.stderr)
        return None, EXIT_NO_VERDICT
    except SpecError as exc:
        say.close()
        print(f"golden {args.command}: {exc}", file=sys.stderr)
        return None, EXIT_USAGE
    except ModuleNotFoundError as exc:
        say.close()
        print(f"golden {args.command}: the workload half is not installed ({exc}); install the harness with its "
              "workload extra, torch pinned to the CPU build: pip install 'torch==2.13.0' "
              "'grpo-golden-harness[workload]' (a harness checkout: ci/bootstrap.sh)", file=sys.stderr)
        return None, EXIT_NO_VERDICT
    except BaseException:
        say.close()
        raise
    result = report_execution(args, execution, say)
    if own:
        say.close()
    return result


def report_execution(args: argparse.Namespace, execution, say=None):
    """Print the run's outcome; ``(execution, None)`` when complete, else ``(None, exit code)``.

    A complete run's status line goes through ``say`` (the progress reporter) when given;
    an incomplete one closes the reporter and prints why to stderr."""
    from harness import interrupts
    from harness.cli import EXIT_NO_VERDICT

    status = execution.postflight.status
    line = f"run {execution.run_dir}: {status} in {execution.wall_s:.1f}s"
    if execution.ok:
        if say is not None:
            say.note(line)
        else:
            print(line, file=sys.stderr)
        return execution, None
    if say is not None:
        say.close()
    print(line, file=sys.stderr)
    for problem in execution.problems():
        print(f"  FAIL {problem}", file=sys.stderr)
    error = run_error(execution.run_dir) or ""
    if error.startswith("interrupted"):
        print(f"golden {args.command}: interrupted; nothing compared or stored (run dir {execution.run_dir})",
              file=sys.stderr)
        return None, interrupts.exit_code()  # 130 Ctrl-C, 143 SIGTERM
    print(f"golden {args.command}: the run did not complete, so there is no verdict "
          f"(exit {EXIT_NO_VERDICT}; logs and traces in {execution.run_dir})", file=sys.stderr)
    return None, EXIT_NO_VERDICT
