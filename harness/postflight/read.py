"""Reading a postflighted run for a verdict: manifest first, confined, complete runs only.

``load_run(path)`` is what every command that judges a run (``golden diff``,
``golden check``, the pytest plugin, ``golden refresh``'s diff) goes through:

1. ``path`` is a run directory or its manifest file; the manifest must exist
   (a run directory gets one from postflight) and is read with ``harness.docio``;
2. the manifest is validated completely (``validate_manifest`` with the run
   directory as base: schema, path spelling, confinement, artifact and surface
   sizes and sha256s). Any error is ``RunUnusable`` (exit 2) listing
   ``FILE#POINTER: message`` lines, and no listed file has been opened except
   through ``confine.confined`` (nothing outside the run directory);
3. a manifest whose ``status`` is not ``complete`` or that records a failed
   check, or a ``run.json`` whose ``status`` is not ``completed``, is ``NoVerdict`` (exit 3), with the reason the
   run recorded (its failed checks, the runner's error);
4. each listed surface is read (the bytes must still have the listed sha256),
   validated against its schema and must name the manifest's workload; a surface
   error is ``RunUnusable``.

Pure gate code: no torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.docio import Limits, read_json, short
from harness.manifest.confine import PathEscape, confined
from harness.manifest.validate import validate_manifest
from harness.surfaces.canonical import StrictJSONError

__all__ = ["RunRefused", "RunUnusable", "NoVerdict", "RunDocuments", "load_run", "run_base"]

MANIFEST = "manifest.json"
RUN_JSON = "run.json"


class RunRefused(ValueError):
    """A run that gets no parity verdict; ``code`` is the exit code, ``lines`` the details."""

    code = 2

    def __init__(self, message: str, lines: list[str] | None = None):
        self.lines = list(lines or [])
        super().__init__(message + "".join(f"\n  {line}" for line in self.lines[:50])
                         + (f"\n  ... {len(self.lines) - 50} more" if len(self.lines) > 50 else ""))


class RunUnusable(RunRefused):
    """Exit 2: the manifest or a surface is invalid, or a path escapes the run directory."""

    code = 2


class NoVerdict(RunRefused):
    """Exit 3: the run did not complete, so there is nothing to compare."""

    code = 3


@dataclass
class RunDocuments:
    base: Path
    manifest: dict
    surfaces: dict[str, dict]
    run: dict | None  # run.json, when the run directory has one


def run_base(path: Path) -> tuple[Path, Path]:
    """(run directory, manifest path) of a run directory or manifest file."""
    path = Path(path)
    if path.is_dir():
        return path, path / MANIFEST
    return path.parent, path


def _read(path: Path, what: str, **kw: Any) -> Any:
    try:
        return read_json(path, what=what, **kw)
    except StrictJSONError as exc:
        raise RunUnusable(f"{what} unusable", [str(exc)]) from None


def load_run(path: str | Path, *, require_complete: bool = True) -> RunDocuments:
    """The validated manifest, surfaces and run.json of a run (module contract)."""
    path = Path(path)
    if not path.exists():
        raise RunUnusable(f"{path}: no such run directory or manifest")
    base, manifest_path = run_base(path)
    if not manifest_path.is_file():
        if require_complete and path.is_dir():
            _refuse_unfinished(base)  # a killed run: its run.json says so (no verdict, exit 3)
        raise RunUnusable(f"{path}: no {MANIFEST} (a run directory gets one from postflight: golden run writes it)")
    if manifest_path.name == MANIFEST and path.is_dir():
        try:
            confined(base, MANIFEST)
        except PathEscape as exc:
            raise RunUnusable(f"{manifest_path}: {exc}") from None
    manifest = _read(manifest_path, "manifest")
    errors = validate_manifest(manifest, base_dir=base, check_artifact_files=True)
    if errors:
        raise RunUnusable(f"{manifest_path}: invalid manifest ({len(errors)} error(s)); nothing was compared",
                          [f"{manifest_path}#{e.pointer}: {short(e.message, 300)}" for e in errors])
    run = None
    if (base / RUN_JSON).exists() or (base / RUN_JSON).is_symlink():
        try:
            run_path = confined(base, RUN_JSON)
        except PathEscape as exc:
            raise RunUnusable(f"{base / RUN_JSON}: {exc}") from None
        run = _read(run_path, "run.json")
        if not isinstance(run, dict):
            raise RunUnusable(f"{base / RUN_JSON}#/: must be a JSON object")
    if require_complete:
        _require_complete(manifest_path, manifest, base, run)
    _check_budget(base, manifest_path, manifest)
    surfaces = {}
    for index, entry in enumerate(manifest["surfaces"]):
        target = confined(base, entry["path"])  # validated above: inside, a regular file
        doc = _read(target, f"surface {entry['name']}", sha256=entry["sha256"])
        surfaces[entry["name"]] = doc
        problems = _surface_errors(doc, entry["name"])
        if problems:
            raise RunUnusable(f"{target}: surface {entry['name']!r} (manifest /surfaces/{index}) fails its schema",
                              [f"{target}#{p}: {short(m, 300)}" for p, m in problems[:20]])
        if doc.get("workload") != manifest["workload"]["name"]:
            raise RunUnusable(f"{target}#/workload: {short(repr(doc.get('workload')), 80)}, but the manifest's "
                              f"/workload/name is {short(repr(manifest['workload']['name']), 80)}: the surface "
                              "is not this run's; nothing was compared")
    return RunDocuments(base, manifest, surfaces, run)


def _refuse_unfinished(base: Path) -> None:
    """A run directory without a manifest whose ``run.json`` records a run that did not
    complete (``running`` when it was killed, ``failed``, ``interrupted``): ``NoVerdict``
    naming that status and the runner's error. Returns when there is no such run.json."""
    if not (base / RUN_JSON).is_file():
        return
    try:
        run = read_json(confined(base, RUN_JSON), what="run.json")
    except (PathEscape, StrictJSONError):
        return  # the caller's "no manifest.json" (unusable input) stands
    status = run.get("status") if isinstance(run, dict) else None
    if status == "completed":
        return
    reasons = [f"{base / RUN_JSON}#/status: {short(repr(status), 60)}",
               f"{base / MANIFEST}: missing (postflight never ran: the run was killed or is still running)"]
    if isinstance(run, dict) and run.get("error"):
        reasons.append(f"runner error: {short(run['error'], 300)}")
    raise NoVerdict(f"{base}: the run did not complete, so there is no verdict", reasons)


def _check_budget(base: Path, manifest_path: Path, manifest: dict) -> None:
    """The documents a verdict reads of one run (manifest, run.json, listed surfaces) sum to at
    most ``Limits.max_total`` (``GOLDEN_READ_BUDGET``), from their sizes, before a surface is read."""
    limits = Limits.from_env()
    paths = [manifest_path, base / RUN_JSON] + [base / e["path"] for e in manifest["surfaces"]]
    sizes = {p: p.stat().st_size for p in paths if p.is_file()}
    total = sum(sizes.values())
    if total > limits.max_total:
        biggest = ", ".join(f"{p.name} {n} bytes" for p, n in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
        raise RunUnusable(f"{base}: the run's documents sum to {total} bytes, over the read budget of "
                          f"{limits.max_total} bytes for one run (GOLDEN_READ_BUDGET; largest: {biggest}); "
                          "nothing was compared")


def _surface_errors(doc: Any, name: str) -> list[tuple[str, str]]:
    from harness.surfaces.registry import SURFACES, validate_surface

    if name not in SURFACES:
        return [("", f"unknown surface {short(name, 60)!r} (known: {', '.join(SURFACES)})")]
    return validate_surface(doc, name=name)


def _require_complete(manifest_path: Path, manifest: dict, base: Path, run: dict | None) -> None:
    reasons = []
    failed = [f"check {c['name']} failed: {short(c['detail'], 300)}"
              for c in manifest["checks"] if c["outcome"] == "fail"]
    if manifest["status"] != "complete":
        reasons.append(f"{manifest_path}#/status: {manifest['status']!r}")
        reasons += failed
    elif failed:  # postflight marks a run complete only when every check passed
        index = next(i for i, c in enumerate(manifest["checks"]) if c["outcome"] == "fail")
        reasons.append(f"{manifest_path}#/checks/{index}/outcome: 'fail' in a manifest whose status is 'complete'")
        reasons += failed
    if run is not None and run.get("status") != "completed":
        reasons.append(f"{base / RUN_JSON}#/status: {short(repr(run.get('status')), 60)}")
        if run.get("error"):
            reasons.append(f"runner error: {short(run['error'], 300)}")
    if reasons:
        raise NoVerdict(f"{base}: the run did not complete, so there is no verdict", reasons)
