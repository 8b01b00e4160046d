"""Report surfaces: six gated canonical JSON documents plus two informational ones.

Document shape (all surfaces)::

    {"surface": "<name>", "version": 1, "workload": "<workload name>",
     "sections": {"<section id>": {...}}}

A *section* is the unit of the digest fast path and of findings: ``policy/rank00003``
for per-rank surfaces (with ``coords``), ``step0001`` for training, a rollout id for
rollouts, a role for topology. See ``registry`` for schemas, normalisation and lanes,
``canonical`` for the byte form and ``digest`` for section digests. Builders from
run artifacts live in ``build_*.py`` modules. No torch, no ray.
"""

from harness.surfaces.canonical import (
    NonFiniteError,
    StrictJSONError,
    canonical_bytes,
    load_strict,
    loads_strict,
    surface_file_bytes,
)
from harness.surfaces.digest import document_digest, section_digests
from harness.surfaces.registry import (
    GATED_SURFACES,
    INFORMATIONAL_SURFACES,
    OPTIONAL_SURFACES,
    SURFACES,
    SurfaceSpec,
    ToleranceRule,
    get_spec,
    normalise,
    schema_for,
    validate_surface,
)

__all__ = [
    "NonFiniteError", "StrictJSONError", "canonical_bytes", "load_strict", "loads_strict",
    "surface_file_bytes", "document_digest", "section_digests", "GATED_SURFACES",
    "INFORMATIONAL_SURFACES", "OPTIONAL_SURFACES", "SURFACES", "SurfaceSpec", "ToleranceRule", "get_spec",
    "normalise", "schema_for", "validate_surface",
]
