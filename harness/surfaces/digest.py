"""Section and document digests: the parity fast path.

Invariants
----------
* ``section_digests(doc)[sid] == section_digests(other)[sid]`` iff the two
  sections have equal canonical bytes (up to sha256 collisions), i.e. iff they are
  equal as JSON values with int/float and bool/int kept apart.
* ``document_digest`` covers the envelope (surface, version, workload) and every
  section, so two documents have the same digest iff their canonical forms are equal.
* Digests are taken over the document as given; callers normalise first
  (``registry.normalise``) when volatile keys may be present.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from harness.surfaces.canonical import canonical_bytes

__all__ = ["sha256_hex", "section_digests", "document_digest"]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def section_digests(doc: Mapping[str, Any]) -> dict[str, str]:
    """``{section_id: sha256 hex of canonical_bytes(section)}`` for ``doc["sections"]``."""
    sections = doc.get("sections")
    if not isinstance(sections, Mapping):
        raise ValueError(f"surface document has no 'sections' object (surface={doc.get('surface')!r})")
    return {sid: sha256_hex(canonical_bytes(body)) for sid, body in sections.items()}


def document_digest(doc: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical bytes of the whole document."""
    return sha256_hex(canonical_bytes(doc))
