"""Run directories as postflight leaves them, for gate tests (no workload runs)."""

from __future__ import annotations

import builtins
import io
import json
import os
from pathlib import Path

from harness.manifest import artifact_entry, surface_entry
from harness.parity.synthetic import synthetic_manifest
from harness.surfaces import surface_file_bytes


def make_run(run: Path, docs: dict, *, status: str = "complete", run_status: str | None = "completed",
             checks: list | None = None) -> Path:
    """A run directory as postflight leaves it (artifact, surfaces, manifest, run.json)."""
    (run / "artifacts/policy").mkdir(parents=True)
    (run / "artifacts/policy/rank00000.trace.jsonl").write_text('{"seq":0}\n')
    (run / "surfaces").mkdir()
    for name, doc in docs.items():
        (run / "surfaces" / f"{name}.json").write_bytes(surface_file_bytes(doc))
    workloads = {doc.get("workload") for doc in docs.values()} - {None}
    manifest = synthetic_manifest(workloads.pop() if len(workloads) == 1 else "w")  # the surfaces' workload
    manifest["status"] = status
    manifest["checks"] = checks if checks is not None else manifest["checks"]
    manifest["artifacts"] = [artifact_entry(run, "artifacts/policy/rank00000.trace.jsonl", role="policy", rank=0)]
    manifest["surfaces"] = [surface_entry(run, name) for name in sorted(docs)]
    write_manifest(run, manifest)
    if run_status is not None:
        (run / "run.json").write_text(json.dumps({"status": run_status, "error": None if run_status == "completed"
                                                  else "interrupted (Ctrl-C or SIGTERM)"}))
    return run


def write_manifest(run: Path, manifest: dict) -> None:
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2))


def read_manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


class OpenLog:
    """Every path opened (``os.open``, ``open``, ``io.open``) while recording, resolved.

    ``with OpenLog() as log:`` records inside the block (hypothesis tests, which must not
    share a function-scoped fixture across examples); ``OpenLog().install(monkeypatch)``
    records from then on until the test ends."""

    def __init__(self):
        self.paths: list[str] = []

    def _hooks(self):
        real_os_open, real_open = os.open, builtins.open

        def note(path):
            try:
                self.paths.append(os.path.realpath(os.fsdecode(path)))
            except (TypeError, ValueError):
                pass

        def os_open(path, *a, **kw):
            note(path)
            return real_os_open(path, *a, **kw)

        def b_open(file, *a, **kw):
            if not isinstance(file, int):
                note(file)
            return real_open(file, *a, **kw)

        return os_open, b_open

    def __enter__(self):
        self._saved = os.open, builtins.open, io.open
        os_open, b_open = self._hooks()
        os.open, builtins.open, io.open = os_open, b_open, b_open
        return self

    def __exit__(self, *exc):
        os.open, builtins.open, io.open = self._saved

    def install(self, monkeypatch) -> OpenLog:
        os_open, b_open = self._hooks()
        monkeypatch.setattr(os, "open", os_open)
        monkeypatch.setattr(builtins, "open", b_open)
        monkeypatch.setattr(io, "open", b_open)
        return self

    def opened(self, path: Path) -> bool:
        return os.path.realpath(path) in self.paths
