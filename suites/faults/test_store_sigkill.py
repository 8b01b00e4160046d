"""SIGKILL a process that rewrites a golden in a loop; the golden is always complete.

50 seeded trials. Each starts a writer that alternates two versions of the same
golden (v0, v1) and SIGKILLs itself at a seeded filesystem step (the n-th fsync,
rename, rmdir or rmtree the store makes), then reads the golden: it must be exactly
v0 or exactly v1 in every file (manifest, provenance, every surface), and pass
`golden validate` as a golden directory. The kill points come from counting the
store's steps in a dry run, so every trial dies inside a write whatever the load
of the machine (no sleep decides where a kill lands).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

from harness.cli.validate import check_path
from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.store import new_provenance, read_golden, write_golden

TRIALS = 50
SEED = 20261129

WRITER = r"""
import os, shutil, signal, sys
from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.store import new_provenance, write_golden
root, kill_at, writes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
versions = []
for v in (0, 1):
    manifest = synthetic_manifest("w")
    manifest["run_id"] = f"run-v{v}"
    versions.append((manifest, synthetic_surfaces("w", seed=v),
                     new_provenance(commit=None, reason=f"v{v}", command="writer", environment={},
                                    date="2026-11-29T00:00:00+00:00")))
steps = 0
def counted(module, name):
    real = getattr(module, name)
    def step(*args, **kwargs):
        global steps
        steps += 1
        if steps == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    setattr(module, name, step)
for module, name in ((os, "fsync"), (os, "rename"), (os, "replace"), (os, "rmdir"), (shutil, "rmtree")):
    counted(module, name)
for i in range(1, writes + 1):
    manifest, docs, prov = versions[i % 2]
    write_golden(root, "w", "cpu", manifest, docs, prov)
print(steps, flush=True)
"""


def _writer(root, kill_at: int, writes: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(kill_at), str(writes)],
                            stdout=subprocess.PIPE, env=env)


def _version(v: int):
    manifest = synthetic_manifest("w")
    manifest["run_id"] = f"run-v{v}"
    return manifest, synthetic_surfaces("w", seed=v), new_provenance(
        commit=None, reason=f"v{v}", command="writer", environment={}, date="2026-11-29T00:00:00+00:00")


def test_sigkilled_golden_writes_leave_a_complete_golden(tmp_path):
    rng = random.Random(SEED)
    expected = {v: _version(v) for v in (0, 1)}
    manifest, docs, prov = expected[0]
    write_golden(tmp_path, "w", "cpu", manifest, docs, prov)
    seen_versions, interrupted = set(), 0
    # Dry run: how many store steps two writes take (v1 over v0, then v0 over v1).
    dry = _writer(tmp_path / "dry", 0, 2)
    out, _ = dry.communicate(timeout=120)
    assert dry.returncode == 0, "dry-run writer failed"
    steps_per_two_writes = int(out)
    assert steps_per_two_writes >= 4, f"the store made only {steps_per_two_writes} counted steps in two writes"
    for trial in range(TRIALS):
        kill_at = rng.randint(1, steps_per_two_writes)
        writer = _writer(tmp_path, kill_at, 2)
        writer.communicate(timeout=120)
        assert writer.returncode == -9, f"trial {trial}: the writer was not killed at step {kill_at}"
        if any(name.startswith(".") for name in os.listdir(tmp_path / "w")):
            interrupted += 1
        golden = read_golden(tmp_path, "w", "cpu")  # recovers, then reads
        version = int(golden.provenance["reason"][1:])
        manifest, docs, prov = expected[version]
        assert golden.manifest["run_id"] == f"run-v{version}", f"trial {trial}: manifest/provenance mix"
        assert golden.surfaces == docs, f"trial {trial}: surfaces are not all from v{version}"
        assert sorted(os.listdir(tmp_path / "w")) == ["cpu"], f"trial {trial}: leftovers after recovery"
        kind, errors = check_path(tmp_path / "w" / "cpu")
        assert kind == "golden directory" and errors == [], f"trial {trial}: {errors}"
        seen_versions.add(version)
    print(f"{TRIALS} trials: versions seen {sorted(seen_versions)}, {interrupted} killed mid-write")
    # The kills land inside writes by construction; some must leave a half-written copy to recover.
    assert interrupted >= 1 and seen_versions == {0, 1}
