"""``golden lint``: scheduled workload x platform pairs vs stored goldens.

Findings (kind):
* ``missing_golden``: a workload schedules a platform (``platform.platforms``) with no golden dir;
* ``unscheduled_golden``: a golden dir for a platform its workload does not schedule;
* ``orphan_golden``: golden dirs under a folder with no ``workload.yaml``;
* ``bad_workload``: ``workload.yaml`` does not load;
* ``leftover_temp``: ``.<platform>.tmp-*`` / ``.old-*`` left by an interrupted write;
* ``bad_provenance``: PROVENANCE.json missing, unparsable or invalid;
* ``missing_manifest``: a golden dir without manifest.json;
* ``damaged_golden``: whatever ``read_golden`` refuses (``integrity.golden_problems``),
  so every check of it would fail: a symlink or over-limit file, a document that
  is not strict JSON (NaN, duplicate key, too deep: ``harness.docio``), a manifest
  that is not schema v2, a surface file missing, unlisted or differing from the
  sha256 the manifest records, a gated surface missing, a surface failing its
  schema; one finding per problem;
* ``machine_specific``: a stored surface holds an absolute path after normalisation
  (``harness.surfaces.portability``), so the golden passes only where it was captured
  (the store refuses to write such a surface; this catches goldens written before);
* ``unlocked_root``: goldens but no ``GOLDENS.lock`` (``harness.store.lock``; ``golden lock``
  writes one); ``bad_lock``: a lock that does not read; ``lock_mismatch``: a golden whose
  files differ from its entry there, or that has none (edited outside capture/refresh);
  ``stale_lock_entry``: an entry for a golden that does not exist.
Lint only reads; it never repairs, and it never crashes on what it reads (any
problem of a stored file is a finding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.docio import read_json, short
from harness.store import layout
from harness.store.provenance import provenance_errors
from harness.store.variants import base_platform
from harness.surfaces.canonical import StrictJSONError

__all__ = ["LintFinding", "lint", "scheduled_platforms"]


@dataclass(frozen=True)
class LintFinding:
    kind: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}: {self.message}"


def scheduled_platforms(workload_yaml: Path) -> list[str]:
    """``platform.platforms`` of a workload spec, read through the spec loader (so a
    spec the loader refuses is a ``bad_workload`` finding, not a guess)."""
    from harness.spec import load_spec

    return list(load_spec(workload_yaml).platform.platforms)


def _golden_dirs(workload_dir: Path) -> list[Path]:
    return sorted(p for p in workload_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def _check_golden(golden: Path, root: Path) -> list[LintFinding]:
    rel = golden.relative_to(root).as_posix()
    if golden.is_symlink():
        return [LintFinding("damaged_golden", rel, "is a symlink (a golden is a directory of regular files)")]
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
            problems = provenance_errors(read_json(prov, what="provenance"))
        except StrictJSONError as exc:
            problems = [f"unparsable: {exc}"]
        out.extend(LintFinding("bad_provenance", f"{rel}/{layout.PROVENANCE}", p) for p in problems)
    return out


def _damage(golden: Path, rel: str) -> list[LintFinding]:
    """What ``read_golden`` would refuse (``integrity.golden_problems``), one finding each."""
    from harness.docio import Limits, parse_json
    from harness.store.atomic import GoldenStoreError, _read_tree, golden_problems

    limits = Limits.from_env()
    try:
        files = _read_tree(golden, limits)
    except GoldenStoreError as exc:
        return [LintFinding("damaged_golden", rel, str(exc))]
    docs, problems = {}, []
    from harness.store.atomic import Unread

    for name in sorted(files):
        if isinstance(files[name], Unread):
            continue  # not listed: golden_problems names it, its content is never read
        if name == layout.MANIFEST or (name.startswith(layout.SURFACES_DIR + "/") and name.endswith(".json")):
            try:
                docs[name] = parse_json(files[name], source=str(golden / name), limits=limits)
            except StrictJSONError as exc:
                problems.append(str(exc))
    if layout.MANIFEST in docs and not problems:
        from harness.store.integrity import listed_surfaces

        surfaces = listed_surfaces(golden, docs[layout.MANIFEST], files, limits)  # keyed as read_golden keys them
        problems = golden_problems(golden, docs[layout.MANIFEST], files, surfaces)
    return [LintFinding("damaged_golden", rel, short(p, 600)) for p in problems]


def _machine_specific(golden: Path, rel: str) -> list[LintFinding]:
    """One finding per stored surface that holds an absolute path (run on undamaged goldens)."""
    from harness.surfaces.portability import absolute_paths, describe

    out = []
    for path in sorted((golden / layout.SURFACES_DIR).glob("*.json")):
        try:
            doc = read_json(path, what="surface")
        except StrictJSONError as exc:  # cannot happen after _damage passed, unless it changed since
            out.append(LintFinding("damaged_golden", rel, str(exc)))
            continue
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
        if workload_dir.is_symlink():  # read_golden refuses it: its goldens would be read from outside the root
            findings.append(LintFinding("damaged_golden", name, "is a symlink (a goldens root holds its workload "
                                        "folders, not links to folders elsewhere)"))
            continue
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
                present = {base_platform(g.name) for g in goldens}  # a CPU-numerics variant counts for its platform
                for platform in scheduled:
                    if platform not in present:
                        findings.append(LintFinding(
                            "missing_golden", f"{name}/{platform}",
                            f"{name} is scheduled on {platform!r} but has no golden there: capture it on a machine "
                            f"of that platform (golden capture {name} --platform {platform}), or, if {name} is not "
                            f"meant to run there, remove {platform!r} from platform.platforms in "
                            f"{root / name / 'workload.yaml'}"))
                for golden in goldens:
                    if base_platform(golden.name) not in scheduled:
                        findings.append(LintFinding("unscheduled_golden", f"{name}/{golden.name}",
                                                    f"platform {golden.name!r} is not in {name}'s platform.platforms "
                                                    f"{scheduled}"))
        for golden in goldens:
            findings.extend(_check_golden(golden, root))
    findings.extend(_lock_findings(root, findings))
    return sorted(findings, key=lambda f: (f.path, f.kind))


def _lock_findings(root: Path, found: list[LintFinding]) -> list[LintFinding]:
    """The goldens lock against what is stored (undamaged goldens only: a damaged one already
    has its findings, and its files are not all read)."""
    from harness.docio import Limits
    from harness.store.atomic import GoldenStoreError, _read_tree
    from harness.store.lock import LOCK_FILE, key, lock_problem, read_lock

    damaged = {f.path.split("/")[0] + "/" + f.path.split("/")[1] for f in found
               if f.kind in ("damaged_golden", "missing_manifest", "bad_provenance") and f.path.count("/") >= 1}
    goldens = [(w.name, g.name) for w in sorted(root.iterdir()) if w.is_dir() and not w.name.startswith(".")
               and not w.is_symlink() for g in _golden_dirs(w)]
    try:
        index = read_lock(root)
    except GoldenStoreError as exc:
        return [LintFinding("bad_lock", LOCK_FILE, str(exc))]
    if index is None:
        return [LintFinding("unlocked_root", LOCK_FILE, f"{len(goldens)} golden(s) but no {LOCK_FILE}: nothing "
                            "shows a golden edited by hand; `golden lock` writes the index (commit it)")] \
            if goldens else []
    out = []
    limits = Limits.from_env()
    for workload, platform in goldens:
        name = key(workload, platform)
        if name in damaged:
            continue
        try:
            files = _read_tree(root / workload / platform, limits)
        except GoldenStoreError:
            continue  # _damage reported it
        problem = lock_problem(root, workload, platform, files, limits)
        if problem:
            out.append(LintFinding("lock_mismatch", name, problem))
    present = {key(w, p) for w, p in goldens}
    out += [LintFinding("stale_lock_entry", f"{LOCK_FILE}#{name}", f"names {name}, which has no golden "
                        "(`golden lock` drops it)") for name in sorted(set(index) - present)]
    return out
