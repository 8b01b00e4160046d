"""The run plan: a workload worked out once, every refusal the spec can know made here.

A :class:`RunPlan` is frozen and holds everything a run decides before any process
starts (TorchTitan's ``ParallelDims`` in spirit: derived once, passed down):

* ``workload``: the typed, validated :class:`~harness.spec.typed.Workload` (overrides and
  the platform's device applied);
* ``topology``: the parallel layout with the rank map (``harness.spec.topology``): every
  rank's node, device, coordinates and groups, the engines, the stage layers;
* ``resources``: the memory estimate (``harness.spec.resources``);
* ``options``: the run's options that are not spec fields (:class:`RunOptions`);
* ``teacher``: a distillation workload's teacher, a typed ``Workload`` of its own (None
  otherwise).

Workers receive the plan's slices as values (TorchTitan style: each component gets the
typed part it needs): the policy and rollout workers ``workload`` and ``topology`` (a
frozen dataclass each: pickled to Ray actors and to engine processes as they are), the
teacher ranks ``teacher``; the switches of ``options`` that a worker reads cross in its
environment (:meth:`RunOptions.worker_env`). Nothing outside ``spec/`` converts, plans
or checks them again.

:func:`build_plan` is the one function that builds it from (workload file or name,
overrides, platform, CLI options), running every check of the spec half there, once:
schema and defaults, the backend packages (``backends.require_backends``), the layout
rules (``constraints``: once), the values a worker would refuse
(``load.check_runnable``), and a local CPU run's memory (``resources.local_refusal``).
Every refusal is a ``SpecError`` (exit 2) naming the field and the rule; nothing has
started and no run directory exists. What needs the machine a run lands on beyond its
memory (a Ray cluster's nodes) is checked by ``harness.flows`` from ``plan.topology``.

:func:`write_plan` / :func:`read_plan` are the one pair that stores a plan in ``run.json``
and reads it back (``spec``, ``spec_digest``, ``topology`` as before, and
``plan_options``); reading re-derives the layout from the stored spec and refuses a
``topology`` that disagrees (a hand-edited run.json).

Gate half: no torch, no ray (``check_runnable``'s trace-settings parser imports torch
only when ``check_trace_settings`` is on: the workload half's callers).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.spec.errors import SpecError
from harness.spec.resources import Resources, estimate, local_refusal
from harness.spec.topology import Topology, plan
from harness.spec.typed import Workload

__all__ = ["DEVICE_PLATFORMS", "PLATFORM_ENV", "SWITCHES", "RunOptions", "RunPlan", "build_plan", "load_for_platform",
           "parse_options", "plan_of", "read_plan", "write_plan"]

DEVICE_PLATFORMS = ("cpu", "cuda")  # golden platforms that name the device a workload runs on
PLATFORM_ENV = "GOLDEN_PLATFORM"  # the platform when no --platform names one
OPTIONS_KEY = "plan_options"  # run.json's record of the RunOptions


# The run's behaviour switches the spec does not know: (field, type, the variable that carries
# it into every worker process or None where only the driver reads it, what it does). Set with
# ``--option FIELD=VALUE`` (``golden run|check|capture|refresh|plan``) or ``--golden-option``
# (pytest); a worker reads its variable, which the runner sets from the plan (docs/spec.md,
# "The run plan").
SWITCHES: tuple[tuple[str, type, str | None, str], ...] = (
    ("worker_logs", bool, None, "worker stdout/stderr shown on the driver (Ray's log_to_driver)"),
    ("cuda_graphs", bool, "HARNESS_NATIVE_CUDA_GRAPHS",
     "native rollout engine: decode steps replayed as CUDA graphs (default: on for cuda at TP 1)"),
    ("decode_kernels", str, "HARNESS_NATIVE_DECODE_KERNELS",
     "native rollout engine: 'standard' or 'invariant' decode kernels (default: the device's)"),
    ("grouped_fp32", bool, "HARNESS_GROUPED_FP32",
     "policy MoE on cuda: float32 experts as grouped GEMMs (default: on; false: the per-expert loop)"),
    ("collective_timeout_s", float, "HARNESS_COLLECTIVE_TIMEOUT_S",
     "policy ranks: seconds before a collective or the rendezvous times out (default 300)"),
)
DECODE_KERNELS = ("standard", "invariant")
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


@dataclass(frozen=True)
class RunOptions:
    """What a run was asked for besides the spec: the golden platform named (``--platform``
    or ``$GOLDEN_PLATFORM``; None: the spec's device), the Ray cluster it joins
    (``--ray-address``, else the spec's ``platform.ray_address``; None: a private local
    instance) and the behaviour switches of :data:`SWITCHES` (None: the default)."""

    platform: str | None = None
    ray_address: str | None = None
    worker_logs: bool = False
    cuda_graphs: bool | None = None
    decode_kernels: str | None = None
    grouped_fp32: bool | None = None
    collective_timeout_s: float | None = None

    def switches(self) -> dict[str, Any]:
        """The switches of :data:`SWITCHES` and their values."""
        return {name: getattr(self, name) for name, *_ in SWITCHES}

    def to_dict(self) -> dict[str, Any]:
        return {"platform": self.platform, "ray_address": self.ray_address, **self.switches()}

    def worker_env(self) -> dict[str, str]:
        """The variables that carry the switches into every worker process: each one set,
        ``""`` where the switch is at its default, so that a value inherited from the
        driver's own environment never decides (the plan does)."""
        out = {}
        for name, _kind, var, _what in SWITCHES:
            if var is None:
                continue
            value = getattr(self, name)
            out[var] = "" if value is None else ("1" if value else "0") if isinstance(value, bool) else str(value)
        return out


def parse_options(pairs: Iterable[str] | Mapping[str, Any] = (), *, source: str | None = None) -> dict[str, Any]:
    """``FIELD=VALUE`` pairs (``--option``; or a mapping of them, run.json's ``plan_options``)
    as the switches they set, checked: ``SpecError`` (exit 2) naming ``options.FIELD`` and
    the rule for an unknown field or a value of the wrong kind."""
    kinds = {name: kind for name, kind, *_ in SWITCHES}
    items = pairs.items() if isinstance(pairs, Mapping) else [_split(p, source) for p in pairs]
    out: dict[str, Any] = {}
    for name, value in items:
        field = f"options.{name}"
        if name not in kinds:
            raise SpecError(field, f"unknown run option (one of {', '.join(kinds)})", source=source)
        if value is None or value == "":
            out[name] = False if name == "worker_logs" else None
            continue
        kind, text = kinds[name], str(value).strip().lower()
        if kind is bool:
            if isinstance(value, bool):
                out[name] = value
            elif text in _TRUE or text in _FALSE:
                out[name] = text in _TRUE
            else:
                raise SpecError(field, f"must be true or false, got {value!r}", source=source)
        elif kind is float:
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = float("nan")
            if not number > 0 or number == float("inf") or isinstance(value, bool):
                raise SpecError(field, f"must be a number of seconds > 0, got {value!r}", source=source)
            out[name] = number
        else:
            if text not in DECODE_KERNELS:
                raise SpecError(field, f"must be one of {', '.join(DECODE_KERNELS)}, got {value!r}", source=source)
            out[name] = text
    return out


def _split(pair: str, source: str | None) -> tuple[str, str]:
    name, sep, value = str(pair).partition("=")
    if not sep or not name.strip():
        raise SpecError("options", f"{pair!r} is not FIELD=VALUE", source=source)
    return name.strip(), value.strip()


@dataclass(frozen=True)
class RunPlan:
    """A run worked out once (module doc). Frozen: pass it (or ``workload`` / ``topology``)
    down as a value; nothing after :func:`build_plan` plans or checks the spec again."""

    workload: Workload
    topology: Topology
    resources: Resources
    options: RunOptions
    source: str = ""  # the file (or run.json) the spec came from, for messages
    teacher: Workload | None = None  # a distillation workload's teacher spec (harness.spec.distill.teacher_spec)

    @property
    def spec(self) -> Workload:
        return self.workload

    @property
    def ray_address(self) -> str | None:
        return self.options.ray_address

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: what ``golden plan --json`` and run.json record."""
        from harness.spec.load import spec_digest

        r = self.resources
        return {"spec": self.workload.to_dict(), "spec_digest": spec_digest(self.workload),
                "topology": self.topology.to_dict(), "options": self.options.to_dict(),
                "resources": {"parameters": r.parameters, "total_bytes": r.total_bytes,
                              "policy_rank_bytes": r.policy_rank_bytes,
                              "activation_rank_bytes": r.activation_rank_bytes,
                              "kv_engine_bytes": r.kv_engine_bytes}}


def build_plan(workload: str | Path, overrides: Iterable[str] = (), *, platform: str | None = None,
               goldens_root: str | Path | None = None, ray_address: str | None = None,
               runnable: bool = True, check_trace_settings: bool = True, packages: bool = True,
               options: Iterable[str] | Mapping[str, Any] = ()) -> RunPlan:
    """The plan of ``workload`` (a name under ``goldens_root`` or a path) with ``overrides``
    on ``platform`` (None: ``$GOLDEN_PLATFORM``; ``""``: the spec's own device; one of
    :data:`DEVICE_PLATFORMS` runs the workload on that device: ``platform.device`` is
    overridden; other names, ``cpu-vllm``, only select the golden), joining ``ray_address``
    (else the spec's ``platform.ray_address``), with the switches ``options`` sets
    (``FIELD=VALUE`` pairs, :func:`parse_options`; checked first).

    The workload file is read once and the layout checked once. ``runnable``: also refuse
    what a worker would refuse (``load.check_runnable``; ``check_trace_settings`` as
    there). ``packages``: refuse an optional backend whose package is not installed here
    (``golden plan`` passes False: a plan can be made where the run will not).
    Raises ``SpecError`` (``TopologyError``, ``BackendMissing`` are ones) naming the field
    and the file."""
    from harness.spec.load import check_runnable

    switches = parse_options(options)
    spec, source = load_for_platform(workload, overrides, platform=platform, goldens_root=goldens_root,
                                     packages=packages)
    run_plan = plan_of(spec, platform=platform, ray_address=ray_address, source=source, options=switches)
    if runnable:
        check_runnable(spec, check_trace_settings=check_trace_settings)
    return run_plan


def load_for_platform(workload: str | Path, overrides: Iterable[str] = (), *, platform: str | None = None,
                      goldens_root: str | Path | None = None, packages: bool = True,
                      check_layout: bool = False) -> tuple[Workload, str]:
    """(the spec, its file): :func:`build_plan`'s first half, the file read once, the schema
    validated, the platform's device applied (``platform`` as there), the backend packages
    checked (``packages``); the layout rules only with ``check_layout`` (``build_plan`` checks
    them when it plans: once). For callers that need the spec and no plan
    (``flows.spec_for_platform``: the pytest session's pre-run verdicts)."""
    from harness.spec.backends import require_backends
    from harness.spec.load import resolve_workload_path, spec_from_dict
    from harness.spec.yaml_io import load_yaml_file

    path, name = resolve_workload_path(workload, goldens_root)
    raw = load_yaml_file(path)
    overrides = tuple(overrides)
    spec = spec_from_dict(raw, source=str(path), overrides=overrides, folder_name=name, check_topology=False)
    wanted = os.environ.get(PLATFORM_ENV) if platform is None else platform
    if wanted in DEVICE_PLATFORMS and wanted != spec.platform.device:
        spec = spec_from_dict(raw, source=str(path), overrides=(*overrides, f"platform.device={wanted}"),
                              folder_name=name, check_topology=False)
    if check_layout:
        from harness.spec.constraints import check_spec

        try:
            check_spec(spec)
        except SpecError as exc:
            raise exc.with_source(str(path)) from None
    if packages:
        require_backends(spec)
    return spec, str(path)


def plan_of(spec: Workload, *, platform: str | None = None, ray_address: str | None = None,
            source: str = "", options: Mapping[str, Any] | None = None) -> RunPlan:
    """The plan of a spec already validated (loaded, or read from run.json): the layout
    checked and laid out (once), the resources estimated, a local CPU run this machine's
    memory cannot hold refused (``SpecError`` naming the field that most decides it).
    ``options``: the switches (:func:`parse_options`' result)."""
    try:
        for _name, _kind, var, _what in SWITCHES:
            if var is not None and var in spec.plugins.env:  # the runner sets it from the plan
                raise SpecError(f"plugins.env.{var}", f"carries the run option {_name} to the workers: set it with "
                                f"--option {_name}=VALUE (docs/spec.md, \"The run plan\")")
        topology = plan(spec)
        resources = estimate(spec)
        address = ray_address or spec.platform.ray_address or None  # RAY_ADDRESS is not followed
        refused = local_refusal(spec, address, resources)
        if refused is not None:
            raise refused
    except SpecError as exc:
        raise exc.with_source(source) if source else exc from None
    teacher = None
    if spec.distill is not None:
        from harness.spec.distill import teacher_spec
        from harness.spec.typed import as_workload

        teacher = as_workload(teacher_spec(spec))
    run_options = RunOptions(platform or None, address, **dict(options or {}))
    return RunPlan(spec, topology, resources, run_options, source, teacher)


def write_plan(run_doc: dict[str, Any], run_plan: RunPlan) -> dict[str, Any]:
    """Record ``run_plan`` in ``run_doc`` (run.json's document, changed in place and returned):
    ``workload``, ``spec`` (the canonical dict), ``spec_digest``, ``topology`` and
    ``plan_options``."""
    doc = run_plan.to_dict()
    run_doc.update(workload=run_plan.workload.name, spec=doc["spec"], spec_digest=doc["spec_digest"],
                   topology=doc["topology"])
    run_doc[OPTIONS_KEY] = doc["options"]
    return run_doc


def read_plan(run_doc: Mapping[str, Any], *, source: str, ray_address: str | None = None) -> RunPlan:
    """The plan a run stored with :func:`write_plan` (``run_doc``: its run.json, read from
    ``source``); ``ray_address``: the cluster the resumed run joins (else the spec's
    ``platform.ray_address``; the stored ``plan_options.ray_address`` is not followed).
    The spec is validated exactly as a workload file is and the layout re-derived; a stored
    ``topology`` that differs from it is refused. ``SpecError`` naming ``source``."""
    from harness.spec.load import spec_from_dict

    if not isinstance(run_doc, Mapping) or "spec" not in run_doc:
        raise SpecError("spec", "holds no spec (#/spec): not a run directory this harness wrote", source=source)
    spec = spec_from_dict(run_doc["spec"], source=f"{source}#/spec", check_topology=False)
    stored = run_doc.get(OPTIONS_KEY)
    stored = stored if isinstance(stored, Mapping) else {}
    platform = stored.get("platform") if isinstance(stored.get("platform"), str) else None
    names = {name for name, *_ in SWITCHES}
    # the switches resume as they ran (checked as --option is); the address is asked again
    # (docs/cluster.md, "Resume on a cluster"): the stored one is a record, never followed, so
    # a resume without --ray-address lands on no cluster by accident
    switches = parse_options({k: v for k, v in stored.items() if k in names}, source=f"{source}#/{OPTIONS_KEY}")
    run_plan = plan_of(spec, platform=platform, ray_address=ray_address, source=f"{source}#/spec", options=switches)
    topology = run_doc.get("topology")
    if topology is not None and topology != run_plan.topology.to_dict():
        raise SpecError("topology", "differs from the layout its spec plans to (run.json edited by hand?)",
                        source=f"{source}#/topology")
    return run_plan
