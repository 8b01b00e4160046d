"""Replay one run's spec in a tree with op-level hashing inside the target module calls.

A replay is ``python -P -m harness run SPEC --platform P --run-dir DIR -q`` of the spec written
to a file, run in ``tree`` with ``PYTHONPATH`` = that tree, then a folder whose
``sitecustomize.py`` loads ``harness/locate/hook.py`` of *this* tree by path into every process
of the replay (the driver and each Ray worker). The hook places its targets with the numerics
probe's own step / microbatch / call counts, so the tree only needs ``harness.taps`` and the
probe (every tree whose runs have a numerics surface has both). The whole run is replayed: the
step's inputs (rollouts, the weights after the earlier steps) are the run's only if every step
before it is run again, which the CPU native backend does bit for bit.

``golden_tree(repo, commit)`` is a temporary ``git worktree`` of the golden's commit (detached,
removed afterwards; refused unless it is clean). No torch here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

HOOK = Path(__file__).with_name("hook.py")
_PLAN_VAR = "GOLDEN_LOCATE_PLAN"
_HOOK_VAR = "GOLDEN_LOCATE_HOOK"

_SITECUSTOMIZE = '''\
# written by golden locate: load the op-level hashing hook into each process of the replay
import os as _os
if _os.environ.get("GOLDEN_LOCATE_PLAN") and _os.environ.get("GOLDEN_LOCATE_HOOK"):
    try:
        import importlib.util as _util
        _spec = _util.spec_from_file_location("_golden_locate_hook", _os.environ["GOLDEN_LOCATE_HOOK"])
        _hook = _util.module_from_spec(_spec)
        _spec.loader.exec_module(_hook)
        _hook.activate()
    except Exception as _exc:  # a process that cannot import the tree's harness (a helper of Ray)
        pass
'''


class ReplayRefused(Exception):
    """The replay cannot be made (exit 2: the reason names the commit, tree or repository)."""


@dataclasses.dataclass
class Replay:
    label: str
    tree: Path
    returncode: int
    records: list[dict]
    tail: str          # the end of the replay's stderr

    def targets(self) -> list[dict]:
        return [r for r in self.records if r.get("kind") == "target"]

    def ops(self) -> list[dict]:
        return [r for r in self.records if r.get("kind") == "op"]


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def repository_of(tree: Path) -> Path | None:
    """The top of the git work tree holding ``tree``, None when it is in none."""
    out = git(tree, "rev-parse", "--show-toplevel")
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def has_commit(repo: Path, commit: str) -> bool:
    return git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


@contextlib.contextmanager
def golden_tree(repo: Path, commit: str, base: Path) -> Iterator[Path]:
    """A detached, clean worktree of ``commit`` under ``base``; removed on the way out."""
    if not has_commit(repo, commit):
        raise ReplayRefused(f"the golden's commit {commit} is not in the repository {repo}; fetch it or "
                            "give --repo the clone that has it")
    path = base / f"golden-{commit[:12]}"
    made = git(repo, "worktree", "add", "--detach", str(path), commit)
    if made.returncode != 0:
        raise ReplayRefused(f"git worktree add of {commit} failed: {made.stderr.strip()}")
    try:
        dirty = git(path, "status", "--porcelain", "--untracked-files=no").stdout.strip()
        if dirty:
            raise ReplayRefused(f"the worktree of {commit} is not clean ({dirty.splitlines()[0]} ...)")
        yield path
    finally:
        git(repo, "worktree", "remove", "--force", str(path))
        git(repo, "worktree", "prune")


def run_replay(label: str, tree: Path, spec: dict, platform: str, plan: dict, base: Path, *,
               timeout: float = 900.0) -> Replay:
    """Replay ``spec`` in ``tree`` with the hook following ``plan`` (``harness.locate.hook``:
    step, microbatch, coords, phase, targets); the records the target rank wrote."""
    work = base / label
    (work / "inject").mkdir(parents=True)
    (work / "inject" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    spec_path = work / "workload.yaml"
    spec_path.write_text(json.dumps(spec, sort_keys=True))   # JSON is YAML
    out = work / "ops.jsonl"
    plan = dict(plan, out=str(out), root=str(tree))
    env = {k: v for k, v in os.environ.items()
           if k not in ("HARNESS_CODE_DIGEST", "HARNESS_CODE_ROOT", "PYTHONPATH", "RAY_ADDRESS")}
    env.update({"PYTHONPATH": os.pathsep.join([str(tree), str(work / "inject")]),
                _PLAN_VAR: json.dumps(plan, sort_keys=True), _HOOK_VAR: str(HOOK)})
    cmd = [sys.executable, "-P", "-m", "harness", "run", str(spec_path), "--platform", platform,
           "--run-dir", str(work / "run"), "-q"]
    try:
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        code, tail = done.returncode, (done.stderr or "")[-3000:]
    except subprocess.TimeoutExpired as exc:
        code, tail = 124, f"replay timed out after {timeout:.0f} s; {(exc.stderr or b'')[-2000:]!r}"
    records = []
    if out.exists():
        for line in out.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
    return Replay(label, tree, code, records, tail)


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="golden-locate-"))
