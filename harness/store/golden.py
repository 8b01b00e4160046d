"""A golden as the store holds it, and the store's errors (no I/O).

``Golden`` is what ``read_golden`` returns; ``files_digest`` is its identity (the
``expect`` of ``write_golden``'s compare-and-swap). Stdlib only (gate half).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.surfaces.digest import sha256_hex

__all__ = ["ANY", "Golden", "GoldenChanged", "GoldenStoreError", "files_digest"]


class GoldenStoreError(ValueError):
    """A golden cannot be written or read; the message names the file or field."""


class GoldenChanged(GoldenStoreError):
    """``write_golden(expect=...)``: the stored golden is not the one the writer compared against
    (another capture/refresh wrote it meanwhile); nothing was written."""


ANY = object()  # write_golden(expect=ANY): replace whatever is stored (no compare-and-swap)


@dataclass
class Golden:
    """A golden as read from the store (``surfaces`` maps surface name -> document)."""

    path: Path
    workload: str
    platform: str
    manifest: dict
    surfaces: dict[str, dict]
    provenance: dict
    tolerances_path: Path | None = None
    files: dict[str, bytes] = field(default_factory=dict, repr=False)
    digest: str = ""  # files_digest(files): what write_golden(expect=...) compares


def files_digest(files: Mapping[str, bytes]) -> str:
    """sha256 over every (relative path, sha256 of bytes) of a golden, sorted by path."""
    listing = "".join(f"{rel}\0{sha256_hex(data)}\n" for rel, data in sorted(files.items()))
    return sha256_hex(listing.encode("utf-8", "surrogateescape"))
