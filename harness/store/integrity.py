"""What makes a golden's files valid: the files a write stores and the checks a read makes.

``golden_files`` validates a run's manifest, surfaces and provenance and returns the
bytes of every file of the golden (what ``write_golden`` stores); ``golden_problems``
lists, in words naming the file and JSON pointer, everything that makes stored files
unusable for a verdict (what ``read_golden`` and ``golden lint`` refuse). No I/O:
``harness.store.atomic`` reads and writes the directories.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.docio import Limits, parse_json, short
from harness.manifest.build import SCHEMA_VERSION
from harness.manifest.validate import validate_manifest
from harness.store import layout
from harness.store.golden import GoldenStoreError
from harness.store.provenance import provenance_errors
from harness.surfaces.canonical import surface_file_bytes
from harness.surfaces.digest import sha256_hex
from harness.surfaces.portability import absolute_paths, describe
from harness.surfaces.registry import GATED_SURFACES, OPTIONAL_SURFACES, SURFACES, validate_surface

__all__ = ["golden_files", "golden_problems", "listed_surfaces", "load_strict_bytes", "stored_golden_problems",
           "tolerance_file_problems", "unknown_files"]

KNOWN_FILES = (layout.MANIFEST, layout.PROVENANCE, layout.TOLERANCES, layout.FOOTPRINT)


def golden_files(workload: str, manifest: Mapping[str, Any], surfaces: Mapping[str, Mapping[str, Any]],
                  provenance: Mapping[str, Any], tolerances: str | None, *, platform: str = "",
                  footprint: Mapping[str, Any] | None = None) -> dict[str, bytes]:
    """Relative path -> bytes of every file of the golden, validated. ``footprint`` (the run's
    ``footprint.json``, ``harness.footprint``) is stored as FOOTPRINT.json. With ``tolerances``
    the stored provenance records its digest (``tolerances: {sha256, bytes}``) and the
    file must pass the tolerance policy of ``platform`` (``policy_problems``)."""
    files: dict[str, bytes] = {}
    entries = []
    for name in sorted(surfaces):
        doc = surfaces[name]
        errors = validate_surface(doc, name=name)
        if errors:
            pointer, message = errors[0]
            raise GoldenStoreError(f"surface {name}: {pointer or '/'}: {message} ({len(errors)} error(s))")
        if doc.get("workload") != workload:
            raise GoldenStoreError(f"surface {name}: /workload is {doc.get('workload')!r}, expected {workload!r}")
        if (name in GATED_SURFACES or name in OPTIONAL_SURFACES) and not doc.get("sections"):
            raise GoldenStoreError(f"surface {name}: /sections is empty (a golden of nothing would pass any run "
                                   "that also records nothing)")
        paths = absolute_paths(doc)
        if paths:
            raise GoldenStoreError(describe(name, paths))
        rel = f"{layout.SURFACES_DIR}/{name}.json"
        files[rel] = surface_file_bytes(doc)
        entries.append({"name": name, "path": rel, "sha256": sha256_hex(files[rel])})
    stored = dict(manifest)
    stored["surfaces"] = entries
    errors = validate_manifest(stored)
    if errors:
        raise GoldenStoreError("manifest: " + "; ".join(str(e) for e in errors))
    if stored["status"] != "complete" or any(c["outcome"] != "pass" for c in stored["checks"]):
        raise GoldenStoreError(f"manifest: /status is {stored['status']!r} with checks "
                               f"{[c['name'] for c in stored['checks'] if c['outcome'] != 'pass']} failing: only a "
                               "complete run whose every check passed becomes a golden")
    if stored["workload"]["name"] != workload:
        raise GoldenStoreError(f"manifest: /workload/name is {stored['workload']['name']!r}, expected {workload!r}")
    provenance = dict(provenance)
    provenance.pop("tolerances", None)
    if tolerances is not None:
        from harness.parity.tolerances import tolerances_record

        files[layout.TOLERANCES] = tolerances.encode("utf-8")
        provenance["tolerances"] = tolerances_record(files[layout.TOLERANCES])
    problems = provenance_errors(provenance)
    if problems:
        raise GoldenStoreError("provenance: " + "; ".join(problems))
    files[layout.MANIFEST] = surface_file_bytes(stored)
    files[layout.PROVENANCE] = surface_file_bytes(provenance)
    if footprint is not None:
        from harness.footprint.schema import problems as footprint_problems

        bad = footprint_problems(footprint, layout.FOOTPRINT)
        if bad:
            raise GoldenStoreError("; ".join(bad))
        files[layout.FOOTPRINT] = surface_file_bytes(footprint)
    if tolerances is not None:
        problems = _tolerance_problems(Path(layout.TOLERANCES), files[layout.TOLERANCES], platform=platform,
                                       provenance=provenance)
        if problems:  # a golden the next read would refuse is never written; the bands are edited by hand
            raise GoldenStoreError(f"{problems[0]} (fix tolerances.yaml by hand; nothing was stored)")
    return files


def golden_problems(target: Path, manifest: Any, files: Mapping[str, bytes],
                    surfaces: Mapping[str, Any]) -> list[str]:
    """Everything that makes a stored golden unusable for a verdict, in words naming the
    file (and JSON pointer): the integrity of the manifest's ``surfaces`` list
    (``_check_integrity``), every gated surface present, every surface document
    valid against its schema and naming its workload. ``[]`` when usable."""
    try:
        _check_integrity(target, manifest, files)
    except GoldenStoreError as exc:
        return [str(exc)]
    problems = unknown_files(target, files)
    where = target / layout.MANIFEST
    listed = {e.get("name") for e in manifest["surfaces"] if isinstance(e, dict) and isinstance(e.get("name"), str)}
    for name in GATED_SURFACES:
        if name not in listed or name not in surfaces:
            problems.append(f"{where}#/surfaces: gated surface {name!r} is missing (every golden stores all of "
                            f"{', '.join(GATED_SURFACES)})")
    for name in sorted(surfaces):
        path = target / layout.SURFACES_DIR / f"{name}.json"
        if name not in SURFACES:
            problems.append(f"{path}: unknown surface {short(name, 60)!r}")
            continue
        errors = validate_surface(surfaces[name], name=name)
        if errors:
            pointer, message = errors[0]
            problems.append(f"{path}#{pointer}: {short(message, 300)} ({len(errors)} schema error(s))")
        elif surfaces[name].get("workload") != target.parent.name:
            problems.append(f"{path}#/workload: {short(repr(surfaces[name].get('workload')), 80)}, expected "
                            f"{target.parent.name!r}")
    problems += [f"{where}#{e.pointer}: {short(e.message, 300)}"
                 for e in validate_manifest(manifest, check_artifact_files=False)]
    problems += stored_golden_problems(target, manifest, surfaces)
    problems += tolerance_file_problems(target, files)
    problems += footprint_file_problems(target, files)
    return problems


def footprint_file_problems(target: Path, files: Mapping[str, bytes]) -> list[str]:
    """A stored FOOTPRINT.json (optional) must be a valid footprint document (``harness.footprint.schema``)."""
    from harness.footprint.schema import problems as footprint_problems

    if layout.FOOTPRINT not in files:
        return []
    where = str(target / layout.FOOTPRINT)
    try:
        doc = parse_json(files[layout.FOOTPRINT], source=where)
    except ValueError as exc:
        return [str(exc)]
    return footprint_problems(doc, where)


def tolerance_file_problems(target: Path, files: Mapping[str, bytes]) -> list[str]:
    """A golden's tolerances.yaml against its PROVENANCE.json (issue 41): covered by the
    recorded digest (or, with no file, no digest recorded), valid, and within the tolerance
    policy of the golden's platform (the folder name) unless waived. ``[]`` when usable."""
    from harness.parity.tolerances import coverage_problems

    provenance: Any = None
    if layout.PROVENANCE in files:
        try:
            provenance = parse_json(files[layout.PROVENANCE], source=str(target / layout.PROVENANCE))
        except ValueError:
            return []  # PROVENANCE.json itself is reported as unreadable elsewhere
    path = target / layout.TOLERANCES
    problems = coverage_problems(str(path), files.get(layout.TOLERANCES), provenance)
    if layout.TOLERANCES in files:  # its coverage first, then what it says (unreadable, over the ceiling)
        problems += _tolerance_problems(path, files[layout.TOLERANCES], platform=target.name, provenance=provenance)
    return problems


def stored_golden_problems(target: Path, manifest: Any, surfaces: Mapping[str, Any]) -> list[str]:
    """What a stored golden's documents must say besides their integrity and schemas: the
    manifest records a complete run (every check passed) of this workload (the folder it
    is stored in), and
    every gated surface holds at least one section (a golden of nothing passes every run
    that also records nothing). ``golden validate`` shares these checks."""
    where = target / layout.MANIFEST
    problems = []
    if isinstance(manifest, dict):
        if manifest.get("status") != "complete":
            problems.append(f"{where}#/status: {short(repr(manifest.get('status')), 40)}, a golden records a "
                            "complete run")
        for index, check in enumerate(manifest.get("checks") or []):
            if isinstance(check, dict) and check.get("outcome") != "pass":
                problems.append(f"{where}#/checks/{index}/outcome: {short(repr(check.get('outcome')), 40)}, a golden "
                                "records a run whose every check passed")
        name = manifest.get("workload", {}).get("name") if isinstance(manifest.get("workload"), dict) else None
        if name != target.parent.name:
            problems.append(f"{where}#/workload/name: {short(repr(name), 80)}, expected {target.parent.name!r} "
                            "(the workload folder it is stored in)")
    for name in (*GATED_SURFACES, *OPTIONAL_SURFACES):
        doc = surfaces.get(name)
        if isinstance(doc, dict) and isinstance(doc.get("sections"), dict) and not doc["sections"]:
            problems.append(f"{target / layout.SURFACES_DIR / (name + '.json')}#/sections: empty (a golden of "
                            "nothing would pass any run that also records nothing)")
    return problems


def unknown_files(target: Path, files: Mapping[str, bytes]) -> list[str]:
    """Files the store never writes: anything but the manifest, provenance, tolerances and
    ``surfaces/*.json`` (the latter checked against the manifest by ``_check_integrity``)."""
    return [f"{target / short(rel, 200)}: not a file a golden holds (the store writes {', '.join(KNOWN_FILES)} "
            f"and {layout.SURFACES_DIR}/<surface>.json only)"
            for rel in sorted(files) if rel not in KNOWN_FILES and not rel.startswith(layout.SURFACES_DIR + "/")]


def _tolerance_problems(path: Path, data: bytes, *, platform: str, provenance: Any) -> list[str]:
    from harness.parity.tolerances import ToleranceFileError, parse_tolerances_bytes, policy_problems

    try:
        tol = parse_tolerances_bytes(data, source=str(path))
    except ToleranceFileError as exc:
        return [str(exc)]
    return policy_problems(tol, platform=platform, provenance=provenance)


def _check_integrity(target: Path, manifest: Any, files: Mapping[str, bytes]) -> None:
    """The stored manifest is schema v2 and its ``surfaces`` list matches the
    surface files byte for byte (sha256): a golden edited by hand, truncated,
    missing a surface or written by another schema version is refused here,
    not compared (a missing surface would otherwise read as a regression)."""
    where = target / layout.MANIFEST
    if not isinstance(manifest, dict):
        raise GoldenStoreError(f"{where}: not a JSON object")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise GoldenStoreError(
            f"{where}#/schema_version: golden has schema_version {short(repr(version), 40)}, this harness reads "
            f"{SCHEMA_VERSION}; recapture it with: golden refresh {target.parent.name} "
            f"--platform {target.name} --reason TEXT")
    entries = manifest.get("surfaces")
    if not isinstance(entries, list):
        raise GoldenStoreError(f"{where}#/surfaces: not a list")
    listed = set()
    for i, entry in enumerate(entries):
        rel = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(rel, str):
            raise GoldenStoreError(f"{where}#/surfaces/{i}/path: missing")
        name = entry.get("name")
        if not isinstance(name, str):
            raise GoldenStoreError(f"{where}#/surfaces/{i}/name: {short(repr(name), 80)} is not a surface name")
        expected = f"{layout.SURFACES_DIR}/{name}.json"
        if rel != expected:  # the store writes surface N to surfaces/N.json, nowhere else (issue 41)
            raise GoldenStoreError(f"{where}#/surfaces/{i}/path: {short(repr(rel), 200)} for surface "
                                   f"{short(repr(name), 80)}; the store keeps it at {short(expected, 200)!r}")
        if rel in listed:
            raise GoldenStoreError(f"{where}#/surfaces/{i}/path: {short(repr(rel), 200)} is listed twice")
        listed.add(rel)
        if rel not in files:
            raise GoldenStoreError(f"{target / short(rel, 200)}: missing (listed in {where}#/surfaces/{i})")
        if sha256_hex(files[rel]) != entry.get("sha256"):
            raise GoldenStoreError(
                f"{target / rel}: sha256 does not match {where}#/surfaces/{i}/sha256 "
                "(the file was changed after capture; goldens change only through golden capture/refresh)")
    for rel in files:
        if rel.startswith(layout.SURFACES_DIR + "/") and rel not in listed:
            raise GoldenStoreError(f"{target / rel}: not listed in {where}#/surfaces")


def listed_surfaces(target: Path, manifest: Any, files: Mapping[str, bytes], limits: Limits | None = None) -> dict:
    """Surface name -> parsed document, keyed by the manifest's ``surfaces[].name`` (the one
    reading of a manifest ``golden validate`` makes too), each read from the path its entry
    lists; entries that are not well formed or whose file is missing are left to
    ``golden_problems``, which names them."""
    out: dict[str, Any] = {}
    entries = manifest.get("surfaces") if isinstance(manifest, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        name, rel = entry.get("name"), entry.get("path")
        if isinstance(name, str) and isinstance(rel, str) and rel in files and name not in out:
            out[name] = load_strict_bytes(files, rel, target, limits)
    return out


def load_strict_bytes(files: Mapping[str, bytes], rel: str, base: Path, limits: Limits | None = None) -> Any:
    if rel not in files:
        raise GoldenStoreError(f"{base / rel}: missing")
    return parse_json(files[rel], source=str(base / rel), limits=limits)
