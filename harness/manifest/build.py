"""Building manifest v2 documents (used by postflight and by tests).

``new_manifest`` only assembles the dict; call ``validate_manifest`` on the result
(postflight does) before writing it. ``artifact_entry`` / ``surface_entry`` hash a
file that already sits under the run directory, so the manifest always describes
bytes that exist.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA_VERSION", "sha256_file", "new_manifest", "artifact_entry", "surface_entry"]

SCHEMA_VERSION = 2
_CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """sha256 hex digest of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _relative(base_dir: Path, rel_path: str) -> Path:
    target = base_dir / rel_path
    if not target.is_file():
        raise FileNotFoundError(f"{rel_path}: no such file under {base_dir}")
    return target


def artifact_entry(base_dir: str | Path, rel_path: str, *, role: str, rank: int | None) -> dict:
    """``{path, role, rank, sha256, bytes}`` for a file under ``base_dir``."""
    target = _relative(Path(base_dir), rel_path)
    return {"path": rel_path, "role": role, "rank": rank,
            "sha256": sha256_file(target), "bytes": target.stat().st_size}


def surface_entry(base_dir: str | Path, name: str, rel_path: str | None = None) -> dict:
    """``{name, path, sha256}`` for a surface file (default path ``surfaces/<name>.json``)."""
    rel_path = rel_path or f"surfaces/{name}.json"
    target = _relative(Path(base_dir), rel_path)
    return {"name": name, "path": rel_path, "sha256": sha256_file(target)}


def new_manifest(
    *,
    run_id: str,
    workload: str,
    spec_digest: str,
    harness_version: str,
    git_commit: str | None,
    environment: Mapping[str, Any],
    topology: Mapping[str, Any],
    plugins: Mapping[str, Any],
    iterations: int,
    status: str,
    artifacts: Iterable[Mapping[str, Any]] = (),
    surfaces: Iterable[Mapping[str, Any]] = (),
    checks: Iterable[Mapping[str, Any]] = (),
) -> dict:
    """A manifest v2 dict with keys in schema order. Entries are copied, not validated.

    ``environment`` needs python, torch, ray, backends, platform, device, world_size;
    ``topology`` needs policy, rollout, rank_map; ``plugins`` needs policy_profiler,
    rollout_profiler, versions; checks are ``{name, outcome: pass|fail, detail}``.
    """
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "workload": {"name": workload, "spec_digest": spec_digest},
        "harness": {"version": harness_version, "git_commit": git_commit},
        "environment": dict(environment),
        "topology": dict(topology),
        "plugins": dict(plugins),
        "iterations": iterations,
        "status": status,
        "artifacts": [dict(a) for a in artifacts],
        "surfaces": [dict(s) for s in surfaces],
        "checks": [dict(c) for c in checks],
    }
