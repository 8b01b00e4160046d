"""``golden validate PATH``: a manifest file, a run directory or a golden directory.

* manifest file / run directory (``manifest.json`` inside): the manifest with
  artifact and surface files checked (exists, bytes, sha256), and each listed
  surface validated against its schema;
* golden directory (``PROVENANCE.json`` inside, or any ``<workload>/<platform>``
  folder whose parent holds a ``workload.yaml``): the manifest (surface files
  only; raw artifacts are not stored in goldens), every ``surfaces/*.json`` listed
  and schema-valid, PROVENANCE.json, and tolerances.yaml when present.

Prints one line per error, ``FILE#POINTER: message``. Exit 0 valid, 1 invalid,
2 when PATH is none of the three.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "validate a manifest, a run directory or a golden directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="manifest.json, a run directory or goldens/<workload>/<platform>")


def _listed(manifest: dict) -> list:
    """The manifest's ``surfaces`` entries when it is a list (else the schema check reports it)."""
    entries = manifest.get("surfaces")
    return entries if isinstance(entries, list) else []


def _surface_errors(base: Path, manifest: dict, refused: set[str]) -> list[str]:
    """Schema errors of the listed surfaces. A surface whose path the manifest check
    refused (``refused``: pointers of its errors) is not opened, and no path is
    opened except through ``confine.confined`` (nothing outside ``base``)."""
    from harness.docio import read_json, short
    from harness.manifest.confine import PathEscape, confined
    from harness.surfaces.canonical import StrictJSONError
    from harness.surfaces.registry import SURFACES, validate_surface

    errors = []
    for index, entry in enumerate(_listed(manifest)):
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            continue
        if f"/surfaces/{index}/path" in refused:
            continue  # its path was refused by the manifest check: not opened
        try:
            target = confined(base, entry["path"])
        except PathEscape:
            continue  # already reported by the manifest check
        try:
            doc = read_json(target, what="surface")
        except StrictJSONError as exc:
            errors.append(str(exc))
            continue
        name = entry.get("name")
        if not isinstance(name, str) or name not in SURFACES:
            continue  # the manifest schema names the surfaces it accepts
        for pointer, message in validate_surface(doc, name=name):
            errors.append(f"{target}#{pointer}: {short(message, 300)}")
    return errors


def check_path(path: Path) -> tuple[str, list[str]]:
    """(kind, error lines) for PATH; raises FileNotFoundError/ValueError when unusable."""
    from harness.docio import read_json, short
    from harness.manifest.validate import validate_manifest
    from harness.surfaces.canonical import StrictJSONError

    if path.is_file():
        kind, manifest_path, golden = "manifest", path, False
    elif (path / "PROVENANCE.json").is_file() or _in_goldens_tree(path):
        kind, manifest_path, golden = "golden directory", path / "manifest.json", True
    elif (path / "manifest.json").is_file():
        kind, manifest_path, golden = "run directory", path / "manifest.json", False
    elif path.exists():
        raise ValueError(
            f"{path}: not a manifest, a run directory (manifest.json) or a golden directory (PROVENANCE.json)"
        )
    else:
        raise FileNotFoundError(f"{path}: no such file or directory")
    base = manifest_path.parent
    if not manifest_path.is_file():
        return kind, [f"{manifest_path}: missing"]
    if kind != "manifest":
        from harness.manifest.confine import PathEscape, confined

        try:
            confined(base, manifest_path.name)
        except PathEscape as exc:
            return kind, [f"{manifest_path}: {exc}"]
    try:
        manifest = read_json(manifest_path, what="manifest")
    except StrictJSONError as exc:
        return kind, [str(exc)]
    problems = validate_manifest(manifest, base_dir=base, check_artifact_files=not golden)
    errors = [f"{manifest_path}#{e.pointer}: {short(e.message, 300)}" for e in problems]
    if isinstance(manifest, dict):
        errors += _surface_errors(base, manifest, {e.pointer for e in problems})
    if golden and isinstance(manifest, dict):
        errors += _golden_extras(base, manifest)
    return kind, errors


def _in_goldens_tree(path: Path) -> bool:
    """``goldens/<workload>/<platform>``: the folder above holds the workload.yaml.
    Such a folder is judged as a golden even when PROVENANCE.json is missing (that
    is then one of its errors), not as a run directory missing its artifacts."""
    return path.is_dir() and (path.resolve().parent / "workload.yaml").is_file()


def _golden_extras(base: Path, manifest: dict) -> list[str]:
    from harness.docio import read_json
    from harness.store.integrity import KNOWN_FILES, stored_golden_problems
    from harness.store.provenance import provenance_errors
    from harness.surfaces.canonical import StrictJSONError

    errors = []
    entries = [e for e in _listed(manifest) if isinstance(e, dict)]  # the schema check names the rest
    listed = {e.get("path") for e in entries if isinstance(e.get("path"), str)}
    for stored in sorted((base / "surfaces").glob("*")):
        rel = stored.relative_to(base).as_posix()
        if rel not in listed:
            errors.append(f"{stored}: not listed in manifest.json /surfaces")
        if stored.is_symlink():
            errors.append(f"{stored}: is a symlink (a golden stores regular files only)")
    for entry in sorted(base.iterdir()):
        if entry.name == "surfaces" and entry.is_dir() and not entry.is_symlink():
            continue
        if entry.name not in KNOWN_FILES:
            errors.append(f"{entry}: not a file a golden holds (the store writes {', '.join(KNOWN_FILES)} "
                          "and surfaces/<surface>.json only)")
        elif entry.is_dir() or entry.is_symlink():
            errors.append(f"{entry}: not a regular file")
    errors += stored_golden_problems(base, manifest, _gated_documents(base, manifest))
    from harness.surfaces.registry import GATED_SURFACES

    names = {e.get("name") for e in entries if isinstance(e.get("name"), str)}
    for name in GATED_SURFACES:
        if name not in names:
            errors.append(f"{base / 'manifest.json'}#/surfaces: gated surface {name!r} is missing from the golden")
    provenance = base / "PROVENANCE.json"
    if not provenance.is_file() or provenance.is_symlink():
        errors.append(f"{provenance}: missing" if not provenance.is_symlink() else f"{provenance}: is a symlink")
        return errors + _tolerance_errors(base)
    try:
        errors += [f"{provenance}#/{p.split(':')[0]}: {p}" for p in provenance_errors(read_json(provenance))]
    except StrictJSONError as exc:
        errors.append(str(exc))
    errors += _tolerance_errors(base)
    return errors + (_lock_errors(base) if not errors else [])


def _lock_errors(base: Path) -> list[str]:
    """The golden against its root's goldens lock (``harness.store.lock``), as ``read_golden``
    checks it: a golden edited consistently by hand is valid in itself, not in its root."""
    from harness.docio import Limits
    from harness.store.atomic import GoldenStoreError, _read_tree
    from harness.store.lock import lock_problem

    golden = base.resolve()
    limits = Limits.from_env()
    try:
        problem = lock_problem(golden.parent.parent, golden.parent.name, golden.name, _read_tree(golden, limits),
                               limits)
    except GoldenStoreError as exc:
        problem = str(exc)
    return [problem] if problem else []


def _gated_documents(base: Path, manifest: dict) -> dict:
    """The listed gated surfaces that read (confined, strict); the others are reported elsewhere."""
    from harness.docio import read_json
    from harness.manifest.confine import PathEscape, confined
    from harness.surfaces.canonical import StrictJSONError
    from harness.surfaces.registry import GATED_SURFACES

    docs = {}
    for entry in _listed(manifest):
        if isinstance(entry, dict) and entry.get("name") in GATED_SURFACES and isinstance(entry.get("path"), str):
            try:
                docs[entry["name"]] = read_json(confined(base, entry["path"]), what="surface")
            except (PathEscape, StrictJSONError):
                continue
    return docs


def _tolerance_errors(base: Path) -> list[str]:
    """What every read of the golden says of its tolerances.yaml (``integrity.tolerance_file_problems``):
    covered by the provenance's digest, valid, within the tolerance policy unless waived."""
    from harness.docio import read_bytes
    from harness.store import layout
    from harness.store.integrity import tolerance_file_problems
    from harness.surfaces.canonical import StrictJSONError

    files: dict[str, bytes] = {}
    for name in (layout.TOLERANCES, layout.PROVENANCE):
        path = base / name
        if path.is_file() and not path.is_symlink():
            try:
                files[name] = bytes(read_bytes(path, what="golden file"))
            except StrictJSONError as exc:
                return [str(exc)]
    return tolerance_file_problems(base, files)


def run(args: argparse.Namespace) -> int:
    path = Path(args.path)
    try:
        kind, errors = check_path(path)
    except (FileNotFoundError, ValueError) as exc:
        print(f"golden validate: {exc}", file=sys.stderr)
        return 2
    if errors:
        for line in errors:
            print(line)
        print(f"golden validate: {path} ({kind}): {len(errors)} error(s)", file=sys.stderr)
        return 1
    print(f"ok: {path} ({kind}) is valid")
    return 0
