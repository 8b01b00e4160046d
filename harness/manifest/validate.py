"""Manifest v2 validation: schema, paths, finiteness and file integrity.

Contract
--------
``validate_manifest(doc, base_dir=...)`` returns every problem it can find as a
``ManifestError`` carrying the JSON pointer (RFC 6901) of the failing field; an
empty list means valid. It never raises on bad *content*. Checks, in order:

1. the document is an object and ``schema_version`` is 2 (otherwise one error that
   names the version found and the supported one, and nothing else is checked);
2. no NaN/inf anywhere (a Python-built dict could hold them);
3. the JSON Schema ``manifest.v2.json`` (a missing or unexpected key is reported at
   the pointer of that key, not of its parent);
4. every artifact/surface path is relative POSIX, has no ``..`` segment and no
   backslash, and artifact paths and surface names are unique
   (``harness.manifest.confine.path_problem``);
5. with ``base_dir``: each path resolves inside ``base_dir`` (symlinks followed,
   ``confine.confined``), names a regular file, and its size and sha256 match;
   a path refused in step 4 is never opened. Artifact files are checked only
   when ``check_artifact_files`` (a golden directory stores surfaces, not the run's
   raw artifacts).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from harness.docio import read_json, short
from harness.manifest.build import SCHEMA_VERSION, sha256_file
from harness.manifest.confine import PathEscape, confined, path_problem
from harness.surfaces.canonical import StrictJSONError, domain_problem, json_pointer

__all__ = ["ManifestError", "ManifestInvalid", "validate_manifest", "load_manifest", "manifest_schema"]


@dataclass(frozen=True)
class ManifestError:
    """One problem in a manifest, located by JSON pointer (``""`` is the whole document)."""

    pointer: str
    message: str

    def __str__(self) -> str:
        return f"{self.pointer or '/'}: {self.message}"


class ManifestInvalid(ValueError):
    """Raised by ``load_manifest`` when the manifest has errors; ``errors`` lists them all."""

    def __init__(self, path: Path, errors: list[ManifestError]):
        self.path = path
        self.errors = errors
        listing = "\n".join(f"  {e}" for e in errors)
        super().__init__(f"{path}: {len(errors)} manifest error(s):\n{listing}")


@lru_cache(maxsize=1)
def _schema_text() -> str:
    return resources.files("harness.manifest").joinpath("manifest.v2.json").read_text()


def manifest_schema() -> dict:
    """The manifest v2 JSON Schema (draft 2020-12)."""
    return json.loads(_schema_text())


@lru_cache(maxsize=1)
def _validator():
    import jsonschema

    return jsonschema.Draft202012Validator(manifest_schema())


def _schema_errors(doc: dict) -> list[ManifestError]:
    errors: list[ManifestError] = []
    for err in _validator().iter_errors(doc):
        base = list(err.absolute_path)
        if err.validator == "required" and isinstance(err.instance, dict):
            for key in err.validator_value:
                if key not in err.instance:
                    errors.append(ManifestError(json_pointer(base + [key]), f"required field {key!r} is missing"))
        elif err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = set(err.schema.get("properties", {}))
            for key in sorted(set(err.instance) - allowed):
                errors.append(ManifestError(json_pointer(base + [key]),
                                            f"unexpected field {key!r} (allowed: {', '.join(sorted(allowed))})"))
        else:
            errors.append(ManifestError(json_pointer(base), short(err.message, 300)))
    return errors


def _check_file(base: Path, rel: str, pointer: str, *, sha256: Any, size: Any = None) -> list[ManifestError]:
    try:
        target = confined(base, rel)
    except PathEscape as exc:
        return [ManifestError(f"{pointer}/path", str(exc))]
    errors = []
    actual_size = target.stat().st_size
    if size is not None and isinstance(size, int) and actual_size != size:
        errors.append(ManifestError(f"{pointer}/bytes", f"{rel}: manifest says {size} bytes, file has {actual_size}"))
    try:
        actual = sha256_file(target)
    except OSError as exc:
        return errors + [ManifestError(f"{pointer}/path", f"{rel}: cannot read: {exc.strerror or exc}")]
    if isinstance(sha256, str) and actual != sha256:
        errors.append(
            ManifestError(
                f"{pointer}/sha256", f"{rel}: sha256 mismatch (manifest {sha256[:16]}..., file {actual[:16]}...)"
            )
        )
    return errors


def validate_manifest(doc: Any, *, base_dir: str | Path | None = None,
                      check_artifact_files: bool = True) -> list[ManifestError]:
    """All problems of a manifest document (see module contract); ``[]`` when valid."""
    if not isinstance(doc, dict):
        return [ManifestError("", f"manifest must be a JSON object, got {type(doc).__name__}")]
    if "schema_version" not in doc:
        return [
            ManifestError(
                "/schema_version", f"required field 'schema_version' is missing (supported: {SCHEMA_VERSION})"
            )
        ]
    found = doc["schema_version"]
    if type(found) is not int or found != SCHEMA_VERSION:
        return [
            ManifestError(
                "/schema_version",
                f"schema_version {found!r} is not supported; this harness reads schema_version {SCHEMA_VERSION}",
            )
        ]
    problem = domain_problem(doc)  # finite floats, integers within 64 bits (the reader's domain)
    if problem is not None and "non-finite" in problem[1]:
        return [ManifestError(*problem)]

    errors = _schema_errors(doc)  # the schema bounds every integer field to 64 bits
    if problem is not None and not any(problem[0].startswith(e.pointer) for e in errors):
        errors.append(ManifestError(*problem))  # an integer outside 64 bits where the schema allows any value

    seen_paths: dict[str, str] = {}
    for kind in ("artifacts", "surfaces"):
        entries = doc.get(kind)
        if not isinstance(entries, list):
            continue
        seen_names: dict[str, int] = {}
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict):
                continue
            pointer = f"/{kind}/{index}"
            path = entry.get("path")
            if isinstance(path, str):
                problem = path_problem(path)
                if problem:
                    errors.append(ManifestError(f"{pointer}/path", problem))
                elif posixpath.normpath(path) in seen_paths:  # ./surfaces//x.json is surfaces/x.json (issue 41)
                    first = seen_paths[posixpath.normpath(path)]
                    errors.append(ManifestError(f"{pointer}/path", f"path {short(path, 200)!r} is listed twice "
                                                f"(the same file as {first})"))
                else:
                    seen_paths[posixpath.normpath(path)] = pointer
            name = entry.get("name")
            if kind == "surfaces" and isinstance(name, str):
                if name in seen_names:
                    errors.append(ManifestError(f"{pointer}/name", f"surface {name!r} is listed twice"))
                seen_names[name] = index

    if base_dir is not None:
        base = Path(base_dir)
        bad_pointers = {e.pointer for e in errors}
        for kind in ("artifacts", "surfaces"):
            if kind == "artifacts" and not check_artifact_files:
                continue
            entries = doc.get(kind)
            for index, entry in enumerate(entries if isinstance(entries, list) else []):  # else: a schema error
                pointer = f"/{kind}/{index}"
                if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
                    continue
                if f"{pointer}/path" in bad_pointers:
                    continue
                errors.extend(_check_file(base, entry["path"], pointer,
                                          sha256=entry.get("sha256"), size=entry.get("bytes")))
    return errors


def load_manifest(path: str | Path, *, check_files: bool = True, check_artifact_files: bool = True) -> dict:
    """Parse (strictly) and validate a manifest file; files are resolved beside it.

    Raises ``ManifestInvalid`` listing every error (a NaN/Infinity token, a JSON
    syntax error or a limit of ``harness.docio`` is reported as one error with its
    pointer), FileNotFoundError if the file does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such manifest")
    try:
        doc = read_json(path, what="manifest")
    except StrictJSONError as exc:
        raise ManifestInvalid(path, [ManifestError(exc.pointer, str(exc))]) from None
    errors = validate_manifest(doc, base_dir=path.parent if check_files else None,
                               check_artifact_files=check_artifact_files)
    if errors:
        raise ManifestInvalid(path, errors)
    return doc
