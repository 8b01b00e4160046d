"""The golden flows shared by the ``golden`` command and the pytest plugin.

``execute``              run a workload (workload half) and postflight it (gate half);
``resume``               continue a stopped run from its newest checkpoint, then postflight it;
``stored_platform``      which stored golden a run on this machine compares with or writes (the
                         platform or its CPU-numerics variant, ``harness.store.variants``);
``compare_with_golden``  the verdict of an execution against the stored golden (``load_golden``);
``remember_golden``      record the golden a refresh that does not compare first replaces;
``store_golden``         write the execution as the golden, atomically, with provenance
                         (compare-and-swap on the golden seen).

``golden check`` is execute + compare_with_golden, ``capture`` execute + store_golden
(none may exist), ``refresh`` execute + compare_with_golden + store_golden
(``harness.cli``; the pytest plugin does the same per workload).

The workload half is imported only inside ``execute``; everything else here
is gate-half code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.parity.comparison import compare
from harness.parity.findings import Verdict
from harness.postflight.run import PostflightResult, postflight
from harness.progress import phase
from harness.spec.load import default_goldens_root
from harness.spec.runplan import RunPlan
from harness.spec.typed import Workload
from harness.surfaces.build import GATED, OPTIONAL

Say = Callable[[str], None]


class GoldenMissing(LookupError):
    """No golden stored for (workload, platform)."""


@dataclass
class Execution:
    """One run and its postflight; ``spec`` is the loaded :class:`Workload` it ran
    (``harness.spec.typed.as_workload`` builds one from part of a spec, for tests)."""

    spec: Workload
    run_dir: Path
    postflight: PostflightResult
    wall_s: float
    # the golden this run was compared against or is meant to replace (its digest, None:
    # there was none), recorded by compare_with_golden or remember_golden; store_golden
    # writes only over that one (compare-and-swap), so a concurrent refresh fails
    golden_seen: object = None
    golden_seen_known: bool = False

    @property
    def ok(self) -> bool:
        return self.postflight.status == "complete"

    def problems(self) -> list[str]:
        return [f"{c['name']}: {c['detail']}" for c in self.postflight.failed_checks]


def platform_of(spec: Workload, platform: str | None = None) -> str:
    """The golden platform: explicit, else ``$GOLDEN_PLATFORM``, else the spec's
    (``harness.spec.load.golden_platform``: the device, ``cpu-vllm`` for vLLM on cpu)."""
    from harness.spec.load import golden_platform

    return platform or os.environ.get("GOLDEN_PLATFORM") or golden_platform(spec)


def numerics_key_of(spec: Workload) -> str | None:
    """The numerics key a run of ``spec`` on this machine has (``harness.numerics``): on the CPU,
    under the pins when the run will be pinned (``harness.portable.pins.wanted_for``); on cuda,
    the GPU architecture and library versions (``cuda_numerics``); None elsewhere."""
    if spec.platform.device == "cuda":
        from harness.numerics import cuda_numerics

        found = cuda_numerics()
        return found["key"] if found else None
    if spec.platform.device != "cpu":
        return None
    from harness.numerics import cpu_numerics
    from harness.portable import pins

    environ = dict(os.environ)
    if pins.wanted_for(spec.platform.device, spec.rollout.backend):
        pins.apply_to_environ(environ)
    numerics = cpu_numerics(environ=environ)
    return numerics["key"] if numerics else None


_canary_checked: set[tuple[str, str]] = set()  # (goldens root, pin set) whose canary this process checked


def pin_numerics(spec: Workload, goldens_root: Path | None, canary: str = "check",
                 say: Say | None = None) -> bool:
    """Pin this process's CPU numerics for a run of ``spec`` (``harness.portable.pins``; its
    children inherit them) and, once per process and goldens root, hold this machine to the
    numerics canary stored there (``harness.portable.drift``). ``canary="store"`` (capture,
    refresh) stores one where the root has none or one of another pin set. Returns whether the
    run is pinned. Raises ``drift.Drift`` (no verdict) when the machine's bits moved."""
    from harness.portable import drift, pins
    from harness.spec.load import default_goldens_root

    if not pins.wanted_for(spec.platform.device, spec.rollout.backend):
        return False
    pins.apply_to_environ()
    root = Path(goldens_root) if goldens_root is not None else default_goldens_root()
    memo = (str(root.resolve()), pins.pin_set_id())
    if memo in _canary_checked:
        return True
    t = time.perf_counter()
    stored = drift.read(root)
    if canary == "store" and (stored is None or stored["pin_set"] != pins.pin_set_id()):
        from harness.numerics import cpu_numerics

        measured = drift.measure()
        machine = cpu_numerics() or {}
        file = drift.store(root, measured, {"model_name": machine.get("model_name"), "vendor": machine.get("vendor"),
                                            "torch": measured.get("state", {}).get("torch")})
        line = f"numerics canary: stored {file} ({len(measured['ops'])} ops)"
    else:
        line = drift.check(root)
    _canary_checked.add(memo)
    if say is not None:
        (getattr(say, "note", None) or say)(f"{line} ({time.perf_counter() - t:.1f}s)")
    return True


def stored_platform(spec: Workload, platform: str, goldens_root: Path, *, write: bool = False,
                    beside: bool = False) -> str:
    """The stored golden a run of ``spec`` on this machine compares with (``write=False``) or a
    capture/refresh writes: ``platform`` or its CPU-numerics variant ``platform@<key>``
    (``harness.store.variants``; ``beside``: a refresh adds a variant beside an unrecorded golden)."""
    from harness.store import variants

    key = numerics_key_of(spec)
    if write:
        return variants.write_platform(goldens_root, spec.name, platform, key, beside=beside)
    return variants.read_platform(goldens_root, spec.name, platform, key)


RUNS_ENV = "GOLDEN_RUNS"


def runs_root() -> Path:
    """Where run directories go unless ``--run-dir`` names one: ``$GOLDEN_RUNS``, else
    ``$XDG_CACHE_HOME/grpo-golden-harness/runs`` (``~/.cache/grpo-golden-harness/runs``): one
    place outside any source tree, never the working directory (a consumer's checkout). Absolute.
    The pytest plugin puts its runs under pytest's own temporary root instead."""
    configured = os.environ.get(RUNS_ENV, "").strip()
    if configured:
        return Path(configured).expanduser().absolute()
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return (base / "grpo-golden-harness" / "runs").absolute()


def default_run_dir(workload: str, root: Path | None = None) -> Path:
    """``<root or runs_root()>/<workload>-<time>-<pid>``."""
    root = root or runs_root()
    return root / f"{workload}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def spec_for_platform(workload: str, overrides: tuple[str, ...] = (), platform: str | None = None,
                      goldens_root: Path | None = None) -> Workload:
    """The spec a run for ``platform`` uses: :func:`harness.spec.runplan.build_plan`'s workload
    (``platform`` naming a device, ``cpu`` or ``cuda``, overrides ``platform.device``; other
    platform names, ``cpu-vllm``, only select the golden), layout rules checked, not planned
    (``harness.spec.runplan.load_for_platform``). Raises ``SpecError`` (``BackendMissing`` for
    an optional backend not installed) before Ray or a worker starts."""
    from harness.spec.runplan import load_for_platform

    return load_for_platform(workload, overrides, platform=platform, goldens_root=goldens_root,
                             check_layout=True)[0]


def plan_run(workload: str, overrides: tuple[str, ...] = (), *, platform: str | None = None,
             goldens_root: Path | None = None, ray_address: str | None = None,
             options: tuple[str, ...] = ()) -> RunPlan:
    """The run's :class:`~harness.spec.runplan.RunPlan`, every check of the spec half made
    (``build_plan``, the runnable check with the trace settings: this imports torch when a
    built-in trace profiler is configured). ``options``: the run's switches (``FIELD=VALUE``,
    ``harness.spec.runplan.SWITCHES``). ``SpecError`` (exit 2) before anything starts."""
    from harness.spec.runplan import build_plan

    return build_plan(workload, overrides, platform=platform, goldens_root=goldens_root, ray_address=ray_address,
                      options=options)


def runnable_plan(run_plan: RunPlan) -> RunPlan:
    """``run_plan`` (built with ``runnable=False``: the pytest session's pre-run verdicts,
    ``harness.pytest_before_run``) once the runnable check ``plan_run`` makes has passed too
    (``load.check_runnable`` with the trace settings: this imports torch when a built-in trace
    profiler is configured), as ``build_plan`` makes it. ``SpecError`` (exit 2) naming the field."""
    from harness.spec.load import check_runnable

    check_runnable(run_plan.workload)
    return run_plan


def execute(workload: str, *, overrides: tuple[str, ...] = (), run_dir: Path | None = None,
            goldens_root: Path | None = None, say: Say | None = None, platform: str | None = None,
            warm=None, ray_address: str | None = None, canary: str = "check",
            plan: RunPlan | None = None) -> Execution:
    """Run + postflight (on ``platform``'s device, see :func:`spec_for_platform`).
    Raises only for unusable input (spec/topology errors, a Ray cluster that cannot
    hold the plan: ``ClusterRefused``, checked before anything starts). ``warm``: a
    ``harness.runner.warm.WarmRuntime`` to reuse Ray and warm worker processes from
    (docs/runner.md); None: a cold run with its own Ray instance. ``ray_address``
    (else the spec's ``platform.ray_address``): join that Ray cluster, cold
    (docs/cluster.md). ``canary``: what :func:`pin_numerics` does with the numerics canary of
    a pinned CPU run ("check", or "store" for capture and refresh). ``plan``: the run's
    plan when the caller built it already (:func:`plan_run`; ``workload``, ``overrides``,
    ``platform``, ``ray_address`` are then not read): the spec is not loaded or checked again."""
    from harness.footprint import recorder
    from harness.runner.run import run_planned

    recorder.install()  # the driver's reads count too (harness.footprint)
    run_plan = plan if plan is not None else plan_run(workload, overrides, platform=platform,
                                                      goldens_root=goldens_root, ray_address=ray_address)
    spec = run_plan.workload
    refuse_unrunnable(run_plan)  # a Ray that cannot hold the plan: ClusterRefused (exit 2)
    pin_numerics(spec, goldens_root, canary, say)  # drift.Drift: this machine's pinned bits moved (no verdict)
    run_dir = Path(run_dir) if run_dir else default_run_dir(spec.name)
    t = time.perf_counter()
    run_planned(run_plan, run_dir, progress=say, warm=warm)
    recorder.bind(run_dir)  # the driver's record: everything it read since install (run_dir must start empty)
    phase(say, "postflight")
    result = postflight(run_dir)
    return Execution(spec, run_dir, result, time.perf_counter() - t)


def refuse_unrunnable(run_plan: RunPlan) -> str | None:
    """What a run of ``run_plan`` would be refused for beyond the plan's own checks (every
    spec rule, the runnable check and this machine's memory are made by ``build_plan``): a
    Ray (local or the cluster at the plan's ``ray_address``) that cannot hold the plan.
    Raises ``SpecError`` (exit 2; ``ClusterRefused`` is one); returns the Ray address the run
    joins (None: local). ``golden check`` asks it before deciding a spec verdict, so unusable
    input is never reported as a finding."""
    address = run_plan.ray_address
    _refuse_unplaceable(run_plan.workload, run_plan.topology.to_dict(), address)
    return address


def _refuse_unplaceable(spec: Workload, topology: dict, address: str | None) -> None:
    """``ClusterRefused`` (exit 2), before anything starts, for a plan the Ray it would run on
    cannot hold: a private local instance is one node; a cluster is joined and checked."""
    if address is None:
        from harness.runner.capacity import local_refusal

        refusal = local_refusal(topology)  # a plan of more nodes than a private instance: exit 2, ray not imported
        if refusal is not None:
            raise refusal
    else:
        from harness.runner.cluster import preflight

        preflight(spec, topology, address)  # ClusterRefused (exit 2) before anything starts


def resume(run_dir: Path, *, say: Say | None = None, ray_address: str | None = None) -> Execution:
    """Continue a stopped run from its newest checkpoint, then postflight it. ``ray_address``
    (else the run's own, else its ``platform.ray_address``): resume on that Ray cluster, checked
    against the plan first like a new run; without one a plan of several nodes is refused
    (``ClusterRefused``, exit 2), since a private local instance is one node."""
    from harness.runner.run import resume_workload

    run_dir = Path(run_dir)
    run_plan = resumed_plan(run_dir, ray_address)
    refuse_unrunnable(run_plan)
    t = time.perf_counter()
    resume_workload(run_dir, progress=say, run_plan=run_plan)
    phase(say, "postflight")
    return Execution(run_plan.workload, run_dir, postflight(run_dir), time.perf_counter() - t)


def resumed_plan(run_dir: Path, ray_address: str | None = None) -> RunPlan:
    """The plan a run stored in its run.json (``harness.spec.runplan.read_plan``: the spec
    validated exactly as a workload file is, the layout re-derived and compared),
    read bounded. ``FileNotFoundError`` without run.json; ``DocumentError`` (not strict
    JSON, too large) or ``SpecError`` (naming the field and ``run.json#/spec``) for one
    that cannot be resumed from."""
    from harness.docio import DocumentError, read_json
    from harness.spec.runplan import read_plan

    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no run.json (not a run directory)")
    doc = read_json(path, what="run.json")
    if not isinstance(doc, dict) or "spec" not in doc:
        raise DocumentError("holds no spec (#/spec): not a run directory this harness wrote", source=str(path))
    return read_plan(doc, source=str(path), ray_address=ray_address)


def resumed_spec(run_dir: Path) -> Workload:
    """The spec of :func:`resumed_plan`."""
    return resumed_plan(run_dir).workload


def load_golden(goldens_root: Path, workload: str, platform: str):
    """The stored golden and its tolerance table; GoldenMissing if absent."""
    from harness.parity.tolerances import ToleranceTable, golden_tolerances
    from harness.store.atomic import read_golden

    try:
        golden = read_golden(goldens_root, workload, platform)
    except FileNotFoundError as exc:
        from harness.cli.hints import golden_command, root_if_chosen
        from harness.store.variants import base_platform, mismatch_note

        hint = golden_command("capture", workload, platform=base_platform(platform),
                              goldens_root=root_if_chosen(goldens_root))
        raise GoldenMissing(
            f"no golden for workload {workload!r} on platform {platform!r}"
            f"{mismatch_note(goldens_root, workload, platform)} (create it with: {hint})"
        ) from exc
    overrides, deterministic, lane_source = (), True, ""
    if golden.tolerances_path is not None:
        tol = golden_tolerances(golden)  # the bytes the digest covered
        overrides = tol.rules
        deterministic = True if tol.deterministic is None else tol.deterministic
        lane_source = tol.deterministic_origin if tol.deterministic is False else ""
    table = ToleranceTable(overrides)
    table.lane_source = lane_source  # what compare_with_golden's verdict header names
    return golden, table, deterministic


def compare_with_golden(execution: Execution, platform: str, goldens_root: Path | None = None) -> Verdict:
    """Parity of the run's surfaces against the stored golden (gated + informational).

    The run's documents are read back through ``harness.postflight.read.load_run``
    (manifest validated first, paths confined, complete runs only: ``RunRefused``
    otherwise). Records which golden was compared in ``execution.golden_seen``."""
    from harness.parity.spec_check import run_against_golden
    from harness.postflight.read import load_run
    from harness.store.atomic import GoldenStoreError, golden_digest

    root = Path(goldens_root or default_goldens_root())
    documents = load_run(execution.run_dir)
    actual = documents.surfaces
    execution.golden_seen_known = True
    try:
        golden, table, deterministic = load_golden(root, execution.spec.name, platform)
    except GoldenMissing:
        execution.golden_seen = None
        raise
    except GoldenStoreError:
        execution.golden_seen = golden_digest(root, execution.spec.name, platform)
        raise
    execution.golden_seen = golden.digest
    verdict = compare(golden.surfaces, actual, tolerances=table, deterministic=deterministic,
                      lane_source=table.lane_source)
    verdict.spec = run_against_golden(documents.manifest, (documents.run or {}).get("spec"), golden.manifest,
                                      golden.provenance)
    return verdict


def spec_difference(spec: Workload, golden) -> object | None:
    """``harness.parity.spec_check.SpecDifference`` of the spec a run would use against ``golden``
    (a ``harness.store.golden.Golden``), or None when they are the same: decided before the run."""
    from harness.parity.spec_check import before_run
    from harness.spec.load import spec_digest

    return before_run(spec.to_dict(), spec_digest(spec), golden.manifest, golden.provenance)


def remember_golden(execution: Execution, digest: str | None) -> None:
    """Record the golden a refresh that does not compare first is meant to replace:
    ``digest`` is ``golden_digest(...)`` read before the workload ran (None: none
    existed). ``store_golden`` then refuses to write when another capture or refresh
    replaced it meanwhile (``GoldenChanged``), as it does after a comparison."""
    execution.golden_seen = digest
    execution.golden_seen_known = True


def store_golden(execution: Execution, platform: str, *, reason: str, goldens_root: Path | None = None,
                 command: str, allow_replace: bool, allow_dirty: bool = False) -> Path:
    """Write the run as the golden of (workload, platform), atomically, with provenance.

    Provenance records the harness commit, the consumer repository holding
    ``goldens_root`` (commit, dirty flag; none is recorded as null) and the
    versions of harness, Python, torch, megatron-core and vLLM (absent: null).
    Refused when the run is incomplete, when ``reason`` is empty, when the
    platform is not scheduled in the spec, and (``allow_replace=False``, i.e.
    capture) when a golden already exists. After ``compare_with_golden`` the write
    is a compare-and-swap on the golden compared against (``GoldenChanged`` when a
    concurrent capture/refresh replaced it); a capture requires that none exists,
    checked again under the store's lock. Uncommitted changes in the repository holding
    ``goldens_root`` outside the goldens root refuse the write (``provenance.uncommitted_changes``)
    unless ``allow_dirty``; then the provenance records their digest (``repository.uncommitted``).
    """
    from harness.manifest.validate import load_manifest
    from harness.runner.environment import collect_environment
    from harness.store.atomic import ANY, write_golden
    from harness.store.layout import golden_dir
    from harness.store.provenance import harness_commit, new_provenance, package_versions, repository_state

    if not (reason or "").strip():
        raise ValueError("a golden needs a reason (--reason TEXT)")
    if not execution.ok:
        raise ValueError("refusing to store an incomplete run as golden:\n  " + "\n  ".join(execution.problems()))
    from harness.store.variants import base_platform

    spec = execution.spec
    if base_platform(platform) not in spec.platform.platforms:
        raise ValueError(f"platform {platform!r} is not scheduled for {spec.name} "
                         f"(platform.platforms = {list(spec.platform.platforms)})")
    root = Path(goldens_root or default_goldens_root())
    target = golden_dir(root, spec.name, platform)
    if target.exists() and not allow_replace:
        raise FileExistsError(f"{target} exists; use golden refresh {spec.name} --reason TEXT")
    manifest = load_manifest(execution.run_dir / "manifest.json")
    from harness.store.provenance import dirty_refusal, uncommitted_changes

    changes = uncommitted_changes(root)
    if changes is not None and not allow_dirty:
        raise ValueError(dirty_refusal(changes))
    repository = repository_state(root)
    if changes is not None and isinstance(repository, dict):
        repository["uncommitted"] = {"diff_sha256": changes["diff_sha256"], "paths": len(changes["paths"])}
    tolerances, evidence = None, None
    old_tol = target / "tolerances.yaml"
    if not old_tol.exists():  # a new CPU-numerics variant declares the bands of the golden it sits beside
        old_tol = golden_dir(root, spec.name, base_platform(platform)) / "tolerances.yaml"
    if old_tol.exists():  # declared bands survive a refresh; read bounded (SpecError: too large, not UTF-8)
        from harness.spec.yaml_io import read_yaml_text

        tolerances = read_yaml_text(old_tol)
        evidence = _tolerance_evidence(old_tol.parent)  # and so do their evidence and waivers (issue 41)
    provenance = new_provenance(commit=harness_commit(), reason=reason.strip(), command=command,
                                environment=collect_environment(spec), repository=repository,
                                versions=package_versions(), tolerance_evidence=evidence, spec=spec.to_dict())
    expect = None if not allow_replace else (execution.golden_seen if execution.golden_seen_known else ANY)
    vendor_builtin_spec(root, spec.name)
    return write_golden(root, spec.name, platform, manifest, execution.postflight.surfaces,
                        provenance, tolerances=tolerances, expect=expect, footprint=_run_footprint(execution.run_dir))


def _run_footprint(run_dir: Path) -> dict | None:
    """The run's ``footprint.json`` (postflight), stored with the golden; None: none was recorded."""
    from harness.docio import read_json

    path = Path(run_dir) / "footprint.json"
    return read_json(path) if path.is_file() else None


def _tolerance_evidence(golden: Path) -> dict | None:
    """``tolerance_evidence`` of the golden whose tolerances.yaml a capture/refresh keeps
    (its waivers admit the file's rules), None when unreadable or absent: the write then
    refuses a rule that needs a waiver, naming it."""
    from harness.docio import read_json
    from harness.surfaces.canonical import StrictJSONError

    try:
        doc = read_json(golden / "PROVENANCE.json", what="provenance")
    except (OSError, StrictJSONError):
        return None
    value = doc.get("tolerance_evidence") if isinstance(doc, dict) else None
    return value if isinstance(value, dict) else None


def vendor_builtin_spec(root: Path, workload: str) -> Path | None:
    """A golden of a built-in workload stored under a root with no spec for it
    (a consumer's first capture) gets a copy of the packaged spec as
    ``<root>/<workload>/workload.yaml``: the root then holds what its goldens were
    made from, a later harness release cannot change it silently, and the
    consumer edits its own copy. Returns the path written, None when nothing was."""
    from harness.spec.load import WORKLOAD_FILE, builtin_workload_path

    target = Path(root) / workload / WORKLOAD_FILE
    source = builtin_workload_path(workload)
    if target.exists() or source is None:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{WORKLOAD_FILE}.tmp-{os.getpid()}")
    tmp.write_bytes(source.read_bytes())
    tmp.replace(target)
    return target


def gated_only(docs: dict[str, dict]) -> dict[str, dict]:
    return {k: v for k, v in docs.items() if k in GATED or k in OPTIONAL}
