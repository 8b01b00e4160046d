"""Manifest v2: what a run produced and how it was checked (``manifest.v2.json``).

``validate_manifest`` reports every problem with its JSON pointer; ``load_manifest``
parses strictly (NaN/Infinity refused) and validates; ``new_manifest`` assembles the
dict. No torch, no ray.
"""

from harness.manifest.build import (
    SCHEMA_VERSION,
    artifact_entry,
    new_manifest,
    sha256_file,
    surface_entry,
)
from harness.manifest.validate import (
    ManifestError,
    ManifestInvalid,
    load_manifest,
    manifest_schema,
    validate_manifest,
)

__all__ = [
    "SCHEMA_VERSION", "artifact_entry", "new_manifest", "sha256_file", "surface_entry",
    "ManifestError", "ManifestInvalid", "load_manifest", "manifest_schema", "validate_manifest",
]
