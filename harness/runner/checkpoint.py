"""Resumable run checkpoints: ``RUN_DIR/checkpoints/stepNNNN/``.

A checkpoint taken after step k holds everything a resumed run needs to
continue as if never stopped:

* ``policy/``            every rank's model, optimizer and RNG (``PolicyGroup.save_checkpoint``)
* ``dataplane.sqlite``   a consistent snapshot of the data plane (sqlite backup API)
* ``ledger.sqlite``      a consistent snapshot of the capture ledger
* ``state.json``         step, prompt-loader position, engine weight version,
                         and how many lines of ``metrics.jsonl`` / ``rollouts.jsonl``
                         belong to steps <= k

It is written into a temporary directory and renamed into place, so a
checkpoint either exists completely or not at all; ``latest`` ignores
leftovers of an interrupted write.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from harness.artifacts import layout

CHECKPOINTS = "checkpoints"
STATE = "state.json"


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step{step:04d}"


def _line_count(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(run_dir: Path, step: int, *, policy, dataplane, ledger, loader, weight_version: int) -> Path:
    """Write the checkpoint after ``step`` atomically; keep only the newest two."""
    run_dir = Path(run_dir)
    root = run_dir / CHECKPOINTS
    root.mkdir(exist_ok=True)
    tmp = root / f".tmp-step{step:04d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    policy.save_checkpoint(str(tmp / "policy"))
    if dataplane is not None:
        dataplane.snapshot(str(tmp / layout.DATAPLANE))
    if ledger is not None:
        ledger.snapshot(str(tmp / layout.LEDGER))
    state = {
        "step": step,
        "loader": loader.state_dict(),
        "weight_version": weight_version,
        "metrics_lines": _line_count(run_dir / layout.METRICS),
        "rollouts_lines": _line_count(run_dir / layout.ROLLOUTS),
    }
    (tmp / STATE).write_text(json.dumps(state, sort_keys=True) + "\n")
    _fsync_tree(tmp)
    final = checkpoint_path(run_dir, step)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    for old in sorted(p for p in root.iterdir() if p.name.startswith("step"))[:-2]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> tuple[Path, dict] | None:
    """The newest complete checkpoint and its state, or None."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return None
    for path in sorted((p for p in root.iterdir() if p.name.startswith("step")), reverse=True):
        state_file = path / STATE
        if state_file.is_file():
            return path, json.loads(state_file.read_text())
    return None


def rewind_logs(run_dir: Path, state: dict) -> None:
    """Cut ``metrics.jsonl`` / ``rollouts.jsonl`` back to what the checkpoint covers."""
    for name, keep in ((layout.METRICS, state["metrics_lines"]), (layout.ROLLOUTS, state["rollouts_lines"])):
        path = Path(run_dir) / name
        if not path.exists():
            continue
        lines = [line for line in path.read_text().splitlines() if line.strip()][:keep]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        os.replace(tmp, path)


def restore_stores(run_dir: Path, checkpoint: Path) -> None:
    """Put the data plane and ledger snapshots in place (before anything opens them)."""
    for name in (layout.DATAPLANE, layout.LEDGER):
        snapshot = checkpoint / name
        target = Path(run_dir) / name
        for suffix in ("", "-wal", "-shm"):
            Path(str(target) + suffix).unlink(missing_ok=True)
        if snapshot.exists():
            shutil.copyfile(snapshot, target)
