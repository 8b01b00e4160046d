"""The surface registry: names, schemas, normalisation and default tolerances.

Every surface is declared once here as a ``SurfaceSpec``. The parity comparison, the
golden store and ``golden validate`` read nothing about a surface from anywhere else.

Lanes
-----
A value is compared in the *exact* lane unless a ``ToleranceRule`` matches it, in
which case it is in the *tolerance* lane for that rule. A rule's ``when`` says
where the band is the verdict:

* ``always``: the band decides on every platform (informational memory/timings);
* ``nondeterministic``: on deterministic platforms the exact lane still decides,
  and a value that fails exact but passes the band is reported as a probable stale
  golden; on nondeterministic platforms the band decides.

Pass rule of a band (symmetric in golden/actual, monotone in ``abs`` and ``rel``):
``|actual - golden| <= abs + rel * max(|actual|, |golden|)``.

Rule matching: ``section`` is an ``fnmatch`` glob over the section id and ``key``
an ``fnmatch`` glob over the dotted key path inside the section (``*`` matches
across dots), e.g. ``metrics.*`` or ``phases.*``. First match wins; workload
rules from ``tolerances.yaml`` are consulted before these defaults.

Normalisation
-------------
``normalise(doc)`` returns a copy without volatile keys (timestamps, pids, hosts,
absolute paths, wall times): keys named in ``volatile_keys`` are dropped from
every object at any depth, except inside *opaque maps* (``opaque_keys``: maps whose
keys are data names, such as operator names or metric names), where only entries
whose dotted path matches a ``drop_globs`` pattern are dropped. Normalisation is
idempotent: ``normalise(normalise(d)) == normalise(d)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cache
from importlib import resources
from typing import Any, Literal

__all__ = [
    "ToleranceRule",
    "SurfaceSpec",
    "SURFACES",
    "GATED_SURFACES",
    "INFORMATIONAL_SURFACES",
    "OPTIONAL_SURFACES",
    "get_spec",
    "schema_for",
    "validate_surface",
    "normalise",
]

When = Literal["always", "nondeterministic"]


@dataclass(frozen=True)
class ToleranceRule:
    """A tolerance band for the values a (surface, section glob, key glob) selects."""

    surface: str
    key: str
    reason: str
    abs: float = 0.0
    rel: float = 0.0
    section: str = "*"
    when: When = "nondeterministic"
    # where the rule was declared: ``<file>#/rules/<i>`` for a tolerances.yaml rule, ``""`` for a
    # surface default (``harness.surfaces.registry``); reports name it (docs/gate.md "Tolerances")
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.reason.strip():
            raise ValueError(f"tolerance for {self.surface}:{self.key} needs a reason")
        for name in ("abs", "rel"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")):
                raise ValueError(
                    f"tolerance for {self.surface}:{self.key}: {name} must be a finite number >= 0, got {value!r}"
                )
        if self.when not in ("always", "nondeterministic"):
            raise ValueError(f"tolerance for {self.surface}:{self.key}: when must be 'always' or 'nondeterministic'")

    def matches(self, surface: str, section: str, key: str) -> bool:
        return surface == self.surface and fnmatchcase(section, self.section) and fnmatchcase(key, self.key)

    def passes(self, golden: float, actual: float) -> bool:
        """The symmetric band test (see module docstring); False for a pair the band
        cannot compare (an integer too large for a float)."""
        try:
            diff = abs(actual - golden)
            return diff <= self.abs + self.rel * max(abs(actual), abs(golden))
        except OverflowError:
            return False

    @property
    def source(self) -> str:
        """Where the rule comes from, for reports: its ``origin``, or the surface default."""
        return self.origin or f"default rule of surface {self.surface} (harness/surfaces/registry.py)"


_COMMON_VOLATILE = frozenset({
    "timestamp", "ts", "time", "date", "start_time", "end_time", "created", "pid", "tid", "ppid",
    "host", "hostname", "node_ip", "ip", "cwd", "abs_path", "run_dir", "wall_s", "duration_s",
})


@dataclass(frozen=True)
class SurfaceSpec:
    """What the gate knows about one surface."""

    name: str
    gated: bool
    description: str
    per_rank: bool
    volatile_keys: frozenset[str] = _COMMON_VOLATILE
    opaque_keys: frozenset[str] = frozenset()
    drop_globs: tuple[str, ...] = ()
    tolerances: tuple[ToleranceRule, ...] = field(default_factory=tuple)
    version: int = 1
    # optional: a gated surface a golden may lack (stored before the surface existed): such a
    # golden is checked on every other surface and the report says "not in this golden
    # (refresh to gate it)" (docs/gate.md, "Optional surfaces"); a golden that has it gates it
    optional: bool = False


_SPECS = [
    SurfaceSpec("topology", True, "rank coordinates and process-group membership per role", False,
                opaque_keys=frozenset({"layout", "groups"})),
    SurfaceSpec("lifecycle", True, "ordered profiler-plugin events per worker", True,
                volatile_keys=_COMMON_VOLATILE | {"token"}),
    SurfaceSpec("operators", True, "operator names and call counts per rank and phase", True,
                opaque_keys=frozenset({"operators"})),
    SurfaceSpec("collectives", True, "ordered collectives (op, group kind, dtype, numel) per rank and phase", True,
                opaque_keys=frozenset({"collectives"})),
    SurfaceSpec("rollouts", True, "per rollout: calls, tokens, chain digests, epochs, decisions", False),
    SurfaceSpec("training", True, "loss and every logged metric per step", False,
                opaque_keys=frozenset({"metrics"}),
                drop_globs=("metrics.timing/*", "metrics.*/timing/*", "metrics.*wall_s*", "metrics.*_time_s"),
                tolerances=(ToleranceRule(
                    "training", "metrics.*", abs=1e-8, rel=1e-2, when="nondeterministic",
                    reason="reduction order differs on nondeterministic platforms; NeMo-RL/Megatron GRPO "
                           "loss gates use 1% relative"),)),
    SurfaceSpec("numerics", True, "bit-exact sha256 per module output, gradient and parameter, per policy "
                                  "rank, step, microbatch and phase (docs/locator.md)", True,
                opaque_keys=frozenset({"entries"}), optional=True),
    SurfaceSpec("memory", False, "informational: bytes per rank and phase", True,
                volatile_keys=frozenset(), opaque_keys=frozenset({"phases"}),
                tolerances=(ToleranceRule(
                    "memory", "phases.*", abs=1 << 20, rel=0.10, when="always",
                    reason="allocator caching and fragmentation vary between runs; informational "
                           "(Megatron GRPO memory gate uses 10%)"),)),
    SurfaceSpec("timings", False, "informational: wall seconds per rank and phase", True,
                volatile_keys=frozenset(), opaque_keys=frozenset({"phases"}),
                tolerances=(ToleranceRule(
                    "timings", "phases.*", abs=0.5, rel=1.0, when="always",
                    reason="wall time on shared CI hosts varies with load; informational only"),)),
]

SURFACES: dict[str, SurfaceSpec] = {spec.name: spec for spec in _SPECS}
# the surfaces every golden must hold (an optional surface is gated where a golden has it)
GATED_SURFACES: tuple[str, ...] = tuple(s.name for s in _SPECS if s.gated and not s.optional)
OPTIONAL_SURFACES: tuple[str, ...] = tuple(s.name for s in _SPECS if s.optional)
INFORMATIONAL_SURFACES: tuple[str, ...] = tuple(s.name for s in _SPECS if not s.gated)


def get_spec(name: str) -> SurfaceSpec:
    try:
        return SURFACES[name]
    except KeyError:
        raise KeyError(f"unknown surface {name!r}; known: {', '.join(SURFACES)}") from None


@cache
def _schema_text(name: str) -> str:
    return resources.files("harness.surfaces").joinpath("schemas", f"{name}.schema.json").read_text()


def schema_for(name: str) -> dict:
    """The JSON Schema (draft 2020-12) of surface ``name``."""
    get_spec(name)
    return json.loads(_schema_text(name))


@cache
def _validator(name: str):
    import jsonschema  # light, but only needed when validating

    return jsonschema.Draft202012Validator(schema_for(name))


@cache
def _fast_check(name: str):
    from harness.surfaces.fastcheck import compile_schema

    return compile_schema(schema_for(name))


def validate_surface(doc: Any, *, name: str | None = None) -> list[tuple[str, str]]:
    """Schema errors of a surface document as ``(json_pointer, message)``, sorted by pointer.

    The surface is ``name`` if given, else ``doc["surface"]``. An unknown surface is
    one error at ``/surface``. A document the compiled check (``harness.surfaces.fastcheck``)
    finds certainly valid has none; every other one is validated by ``jsonschema``, which
    finds and words the errors.
    """
    from harness.surfaces.canonical import json_pointer

    if name is None:
        name = doc.get("surface") if isinstance(doc, Mapping) else None
    if name not in SURFACES:
        return [("/surface", f"unknown surface {name!r}; known: {', '.join(SURFACES)}")]
    from harness.surfaces.canonical import domain_problem

    problem = domain_problem(doc)  # finite floats, integers within 64 bits: what the comparison can compare
    if problem is not None:
        return [problem]
    fast = _fast_check(name)
    if fast is not None and fast(doc):
        return []
    errors = [(json_pointer(list(e.absolute_path)), e.message) for e in _validator(name).iter_errors(doc)]
    return sorted(errors)


def _normalise_node(node: Any, spec: SurfaceSpec, path: str) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in spec.volatile_keys:
                continue
            child_path = f"{path}.{key}" if path else key
            if key in spec.opaque_keys:
                if spec.drop_globs and isinstance(value, dict):
                    value = {k: v for k, v in value.items()
                             if not any(fnmatchcase(f"{child_path}.{k}", g) for g in spec.drop_globs)}
                out[key] = value
            else:
                out[key] = _normalise_node(value, spec, child_path)
        return out
    if isinstance(node, list):
        return [_normalise_node(item, spec, path) if isinstance(item, (dict, list)) else item for item in node]
    return node


def normalise(doc: Mapping[str, Any]) -> dict:
    """A copy of a surface document without its surface's volatile keys (idempotent).

    Key paths for ``drop_globs`` are relative to the section (``metrics.timing/x``).
    Unknown surfaces raise KeyError.
    """
    spec = get_spec(doc["surface"])
    out = dict(doc)
    sections = doc.get("sections")
    if isinstance(sections, Mapping):
        out["sections"] = {sid: _normalise_node(body, spec, "") for sid, body in sections.items()}
    return out
