"""``golden lint``: scheduled workload x platform pairs vs stored goldens.

Findings (kind):
* ``missing_golden``: a workload schedules a platform (``platform.platforms``) with no golden dir;
* ``unscheduled_golden``: a golden dir for a platform its workload does not schedule;
* ``orphan_golden``: golden dirs under a folder with no ``workload.yaml``;
* ``bad_workload``: ``workload.yaml`` does not load;
* ``leftover_temp``: ``.<platform>.tmp-*`` / ``.old-*`` left by an interrupted write;
* ``bad_provenance``: PROVENANCE.json missing, unparsable or invalid;
* ``missing_manifest``: a golden dir without manifest.json;
* ``damaged_golden``: the manifest is not schema v2, or a surface file is missing,
  unlisted or differs from the sha256 the manifest records (edited by hand,
  truncated): ``read_golden`` refuses such a golden, so every check of it would fail;
* ``machine_specific``: a stored surface holds an absolute path after normalisation
  (``harness.surfaces.portability``), so the golden passes only where it was captured
  (the store refuses to write such a surface; this catches goldens written before).
Lint only reads; it never repairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.store import layout
from harness.store.provenance import provenance_errors
from harness.surfaces.canonical import StrictJSONError, load_strict

__all__ = ["LintFinding", "lint", "scheduled_platforms"]


@dataclass(frozen=True)
class LintFinding:
    kind: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}: {self.message}"


def scheduled_platforms(workload_yaml: Path) -> list[str]:
    """``platform.platforms`` of a workload spec, through harness.spec when available."""
    try:
        from harness.spec import load_spec
    except ImportError:  # the spec loader is not there: read the field directly
        import yaml

        doc = yaml.safe_load(workload_yaml.read_text()) or {}
        platforms = (doc.get("platform") or {}).get("platforms", ["cpu"])
    else:
        platforms = load_spec(workload_yaml)["platform"]["platforms"]
    if not isinstance(platforms, list) or not all(isinstance(p, str) for p in platforms):
        raise ValueError(f"platform.platforms must be a list of names, got {platforms!r}")
    return platforms


def _golden_dirs(workload_dir: Path) -> list[Path]:
    return sorted(p for p in workload_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def _check_golden(golden: Path, root: Path) -> list[LintFinding]:
    rel = golden.relative_to(root).as_posix()
    out = []
    if not (golden / layout.MANIFEST).is_file():
        out.append(LintFinding("missing_manifest", rel, f"no {layout.MANIFEST}"))
    else:
        out.extend(_damage(golden, rel) or _machine_specific(golden, rel))
    prov = golden / layout.PROVENANCE
    if not prov.is_file():
        out.append(LintFinding("bad_provenance", rel, f"no {layout.PROVENANCE}"))
    else:
        try:
            problems = provenance_errors(load_strict(prov))
        except (StrictJSONError, UnicodeDecodeError) as exc:
            problems = [f"unparsable: {exc}"]
        out.extend(LintFinding("bad_provenance", f"{rel}/{layout.PROVENANCE}", p) for p in problems)
    return out


def _damage(golden: Path, rel: str) -> list[LintFinding]:
    """What ``read_golden``'s integrity check would refuse (see atomic._check_integrity)."""
    from harness.store.atomic import GoldenStoreError, _check_integrity

    try:
        manifest = load_strict(golden / layout.MANIFEST)
        files = {p.relative_to(golden).as_posix(): p.read_bytes()
                 for p in sorted((golden / layout.SURFACES_DIR).rglob("*")) if p.is_file()}
        _check_integrity(golden, manifest, files)
    except (StrictJSONError, UnicodeDecodeError, GoldenStoreError) as exc:
        return [LintFinding("damaged_golden", rel, str(exc))]
    return []


def _machine_specific(golden: Path, rel: str) -> list[LintFinding]:
    """One finding per stored surface that holds an absolute path (run on undamaged goldens)."""
    from harness.surfaces.portability import absolute_paths, describe

    out = []
    for path in sorted((golden / layout.SURFACES_DIR).glob("*.json")):
        doc = load_strict(path)
        found = absolute_paths(doc) if isinstance(doc, dict) and "surface" in doc else []
        if found:
            out.append(LintFinding("machine_specific", f"{rel}/{layout.SURFACES_DIR}/{path.name}",
                                   describe(path.stem, found)))
    return out


def lint(goldens_root: str | Path) -> list[LintFinding]:
    """All lint findings under ``goldens_root`` (sorted by path, then kind)."""
    root = Path(goldens_root)
    if not root.is_dir():
        raise FileNotFoundError(f"goldens root {root} is not a directory")
    findings: list[LintFinding] = []
    for workload_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        name = workload_dir.name
        for entry in sorted(workload_dir.iterdir()):
            if layout.is_leftover(entry.name):
                findings.append(LintFinding("leftover_temp", f"{name}/{entry.name}",
                                            "left by an interrupted golden write; the next read or write removes it"))
        goldens = _golden_dirs(workload_dir)
        spec_path = workload_dir / layout.WORKLOAD_FILE
        if not spec_path.is_file():
            for golden in goldens:
                findings.append(LintFinding("orphan_golden", f"{name}/{golden.name}",
                                            f"no {layout.WORKLOAD_FILE} in {name}/: the golden belongs to no workload"))
        else:
            try:
                scheduled = scheduled_platforms(spec_path)
            except Exception as exc:  # noqa: BLE001 - any loader error is a lint finding
                findings.append(LintFinding("bad_workload", f"{name}/{layout.WORKLOAD_FILE}", str(exc)))
                scheduled = None
            if scheduled is not None:
                present = {g.name for g in goldens}
                for platform in scheduled:
                    if platform not in present:
                        findings.append(LintFinding("missing_golden", f"{name}/{platform}",
                                                    f"{name} is scheduled on {platform!r} but has no golden there "
                                                    f"(golden capture {name} --platform {platform})"))
                for golden in goldens:
                    if golden.name not in scheduled:
                        findings.append(LintFinding("unscheduled_golden", f"{name}/{golden.name}",
                                                    f"platform {golden.name!r} is not in {name}'s platform.platforms "
                                                    f"{scheduled}"))
        for golden in goldens:
            findings.extend(_check_golden(golden, root))
    return sorted(findings, key=lambda f: (f.path, f.kind))
