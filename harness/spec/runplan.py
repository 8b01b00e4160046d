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

__all__ = ["DEVICE_PLATFORMS", "PLATFORM_ENV", "RunOptions", "RunPlan", "build_plan", "load_for_platform", "plan_of",
           "read_plan", "write_plan"]

DEVICE_PLATFORMS = ("cpu", "cuda")  # golden platforms that name the device a workload runs on
PLATFORM_ENV = "GOLDEN_PLATFORM"  # the platform when no --platform names one
OPTIONS_KEY = "plan_options"  # run.json's record of the RunOptions


@dataclass(frozen=True)
class RunOptions:
    """What a run was asked for besides the spec: the golden platform named (``--platform``
    or ``$GOLDEN_PLATFORM``; None: the spec's device) and the Ray cluster it joins
    (``--ray-address``, else the spec's ``platform.ray_address``; None: a private local
    instance)."""

    platform: str | None = None
    ray_address: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"platform": self.platform, "ray_address": self.ray_address}


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
               runnable: bool = True, check_trace_settings: bool = True, packages: bool = True) -> RunPlan:
    """The plan of ``workload`` (a name under ``goldens_root`` or a path) with ``overrides``
    on ``platform`` (None: ``$GOLDEN_PLATFORM``; ``""``: the spec's own device; one of
    :data:`DEVICE_PLATFORMS` runs the workload on that device: ``platform.device`` is
    overridden; other names, ``cpu-vllm``, only select the golden), joining ``ray_address``
    (else the spec's ``platform.ray_address``).

    The workload file is read once and the layout checked once. ``runnable``: also refuse
    what a worker would refuse (``load.check_runnable``; ``check_trace_settings`` as
    there). ``packages``: refuse an optional backend whose package is not installed here
    (``golden plan`` passes False: a plan can be made where the run will not).
    Raises ``SpecError`` (``TopologyError``, ``BackendMissing`` are ones) naming the field
    and the file."""
    from harness.spec.load import check_runnable

    spec, source = load_for_platform(workload, overrides, platform=platform, goldens_root=goldens_root,
                                     packages=packages)
    run_plan = plan_of(spec, platform=platform, ray_address=ray_address, source=source)
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
            source: str = "") -> RunPlan:
    """The plan of a spec already validated (loaded, or read from run.json): the layout
    checked and laid out (once), the resources estimated, a local CPU run this machine's
    memory cannot hold refused (``SpecError`` naming the field that most decides it)."""
    try:
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
    return RunPlan(spec, topology, resources, RunOptions(platform or None, address), source, teacher)


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
    # the address is asked again (docs/cluster.md, "Resume on a cluster"): the stored one is a record,
    # never followed, so a resume without --ray-address lands on no cluster by accident
    run_plan = plan_of(spec, platform=platform, ray_address=ray_address, source=f"{source}#/spec")
    topology = run_doc.get("topology")
    if topology is not None and topology != run_plan.topology.to_dict():
        raise SpecError("topology", "differs from the layout its spec plans to (run.json edited by hand?)",
                        source=f"{source}#/topology")
    return run_plan
