"""``golden diff RUN GOLDEN``: compare a run's surfaces with a golden.

RUN is a run directory holding the manifest.json postflight wrote, or that
manifest file, or a golden directory (read as the store reads it). The
manifest is validated first (``harness.postflight.read``):
nothing it lists outside the run directory is opened, an invalid manifest or
surface is unusable input (exit 2), and a run whose manifest or run.json is
not complete gets no verdict (exit 3). GOLDEN is a golden directory or a workload name
(resolved under ``--goldens-root`` with ``--platform``, which defaults to
``$GOLDEN_PLATFORM``, else the platform the run's spec implies (its ``run.json``),
else the manifest's ``environment.device``). Lanes: ``--nondeterministic`` (or
``deterministic: false`` in the golden's tolerances.yaml) lets tolerance bands decide.

Exit 0 parity, 1 findings (including a probable stale golden), 2 unusable input,
3 no verdict (the run did not complete).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "compare a run (or manifest) with a golden"


class UnusableInput(Exception):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_path", metavar="RUN", help="run directory or manifest.json")
    parser.add_argument("golden", metavar="GOLDEN", help="golden directory, or a workload name")
    parser.add_argument("--platform", default=None, help="platform of the golden when GOLDEN is a workload name")
    from harness.cli._options import add_goldens_root, add_report_arguments

    add_goldens_root(parser, type=Path)
    add_report_arguments(parser, output_type=Path)
    parser.add_argument(
        "--show-info", action="store_true", help="terminal: list informational (not gated) findings too"
    )
    lanes = parser.add_mutually_exclusive_group()
    lanes.add_argument("--nondeterministic", action="store_true", help="tolerance bands decide (GPU platforms)")
    lanes.add_argument(
        "--deterministic", action="store_true", help="exact lane decides even if tolerances.yaml says otherwise"
    )


def load_run_surfaces(run_path: Path):
    """The run's validated documents (``harness.postflight.read.load_run``): the
    manifest first, every listed path confined to the run directory, complete runs
    only. A golden directory (PROVENANCE.json, no run.json) as RUN is read as the
    store reads it (``read_golden_dir``: every check ``read_golden`` makes; its
    manifest lists the artifacts of the run it was captured from, which a golden
    does not store), so two goldens can be compared. Raises ``RunRefused`` (exit 2
    unusable, exit 3 no verdict)."""
    from harness.postflight.read import RunDocuments, RunUnusable, load_run

    path = Path(run_path)
    if path.is_dir() and (path / "PROVENANCE.json").exists() and not (path / "run.json").exists():
        from harness.store.atomic import GoldenStoreError, read_golden_dir

        try:
            golden = read_golden_dir(path)
        except (FileNotFoundError, GoldenStoreError) as exc:
            raise RunUnusable(f"{path}: golden unusable as RUN; nothing was compared", [str(exc)]) from None
        return RunDocuments(golden.path, golden.manifest, golden.surfaces, None)
    return load_run(run_path)


def run_platform(run, manifest: dict | None) -> str | None:
    """The golden platform a run belongs to: ``$GOLDEN_PLATFORM``, else the one its
    spec implies (``run.json`` beside the manifest, as ``golden run`` writes it),
    else the manifest's ``environment.device`` when that names a device platform.

    Not ``environment.platform``: that is the host's OS/arch (``linux-x86_64``),
    never a golden platform. ``run`` is the run's ``run.json`` document (or None)."""
    import os

    from harness.spec.load import golden_platform

    if os.environ.get("GOLDEN_PLATFORM"):
        return os.environ["GOLDEN_PLATFORM"]
    try:
        return golden_platform(run.get("spec"))
    except (AttributeError, KeyError, TypeError):
        pass
    device = ((manifest or {}).get("environment") or {}).get("device")
    return device if device in ("cpu", "cuda") else None


def _golden(args: argparse.Namespace, documents):
    from harness.store.atomic import GoldenStoreError, read_golden, read_golden_dir

    try:
        path = Path(args.golden)
        if path.is_dir():
            if args.platform and args.platform != path.resolve().name:
                raise UnusableInput(f"--platform {args.platform!r} contradicts GOLDEN {args.golden}, the golden of "
                                    f"platform {path.resolve().name!r}; drop --platform or name the other golden")
            return read_golden_dir(path)
        platform = args.platform or run_platform(documents.run, documents.manifest)
        if not platform:
            raise UnusableInput(f"GOLDEN {args.golden!r} is not a directory and the run does not say its golden "
                                "platform; give --platform to pick its golden")
        if args.goldens_root is not None:
            root = args.goldens_root
        else:
            from harness.cli.lint import default_root

            root = default_root()
        from harness.store.variants import manifest_key, read_platform

        key = manifest_key(documents.manifest)  # the run's machine, not this one
        return read_golden(root, args.golden, read_platform(root, args.golden, platform, key))
    except (FileNotFoundError, GoldenStoreError, ValueError) as exc:
        raise UnusableInput(str(exc)) from None


def _run_inputs(documents) -> tuple[Path, ...]:
    """The run's files this comparison read (manifest, run.json, listed surfaces and artifacts)."""
    base = documents.base
    listed = [e["path"] for kind in ("surfaces", "artifacts") for e in documents.manifest.get(kind, [])]
    return tuple(base / rel for rel in ["manifest.json", "run.json", *listed])


def run(args: argparse.Namespace) -> int:
    from harness.cli._workload_args import Refused, check_output_target, resolve_report, write_report
    from harness.parity.comparison import compare
    from harness.parity.render import render
    from harness.parity.render.common import summary_line
    from harness.parity.step_times import step_times
    from harness.parity.tolerances import ToleranceFileError, ToleranceTable, golden_tolerances
    from harness.postflight.read import RunRefused
    from harness.surfaces.canonical import NonFiniteError

    try:
        resolve_report(args)
    except Refused as exc:
        print(f"golden diff: {exc}", file=sys.stderr)
        return 2
    try:
        documents = load_run_surfaces(Path(args.run_path))
    except RunRefused as exc:
        verdict_word = "no verdict" if exc.code == 3 else "unusable input"
        print(f"golden diff: {verdict_word}: {exc}", file=sys.stderr)
        return exc.code
    actual = documents.surfaces
    try:
        golden = _golden(args, documents)
        overrides, deterministic, lane_source = (), True, ""
        if golden.tolerances_path is not None:
            tol = golden_tolerances(golden)  # the bytes the digest covered
            overrides = tol.rules
            deterministic = tol.deterministic if tol.deterministic is not None else True
            lane_source = tol.deterministic_origin if tol.deterministic is False else ""
        if args.nondeterministic:
            deterministic, lane_source = False, "--nondeterministic"
        elif args.deterministic:
            deterministic, lane_source = True, ""
        verdict = compare(golden.surfaces, actual, tolerances=ToleranceTable(overrides), deterministic=deterministic,
                          lane_source=lane_source)
        from harness.parity.spec_check import run_against_golden

        verdict.spec = run_against_golden(documents.manifest, (documents.run or {}).get("spec"), golden.manifest,
                                          golden.provenance)  # the first finding, when the specs differ
    except (UnusableInput, ToleranceFileError, NonFiniteError, ValueError) as exc:
        print(f"golden diff: unusable input: {exc}", file=sys.stderr)
        return 2
    try:
        check_output_target(args.output, golden_dir=golden.path, inputs=_run_inputs(documents))
    except Refused as exc:
        print(f"golden diff: {exc}", file=sys.stderr)
        return 2
    title = f"golden diff {golden.workload}/{golden.platform}"
    manifest = documents.manifest
    run_fields = {"run_id": manifest["run_id"]} if "run_id" in manifest else None
    report = render(verdict, args.format, title=title, color=False if args.output else None, show_info=args.show_info,
                    surfaces_actual=actual, surfaces_golden=golden.surfaces, provenance=golden.provenance,
                    run=run_fields, step_times=step_times(golden.surfaces.get("timings"), actual.get("timings")))
    if args.output:
        write_report(args.output, report)
        print(f"{title}: {summary_line(verdict)} (report: {args.output})")
    else:
        sys.stdout.write(report)
    return 0 if verdict.ok else 1
