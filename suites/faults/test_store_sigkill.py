"""SIGKILL a process that rewrites a golden in a loop; the golden is always complete.

50 seeded trials. Each starts a writer that alternates two versions of the same
golden (v0, v1), kills it with SIGKILL after a seeded random delay, then reads the
golden: it must be exactly v0 or exactly v1 in every file (manifest, provenance,
every surface), and pass `golden validate` as a golden directory.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from harness.cli.validate import check_path
from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.store import new_provenance, read_golden, write_golden

TRIALS = 50
SEED = 20261129

WRITER = r"""
import sys
from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.store import new_provenance, write_golden
root = sys.argv[1]
versions = []
for v in (0, 1):
    manifest = synthetic_manifest("w")
    manifest["run_id"] = f"run-v{v}"
    versions.append((manifest, synthetic_surfaces("w", seed=v),
                     new_provenance(commit=None, reason=f"v{v}", command="writer", environment={},
                                    date="2026-11-29T00:00:00+00:00")))
print("ready", flush=True)
i = 1
while True:
    manifest, docs, prov = versions[i % 2]
    write_golden(root, "w", "cpu", manifest, docs, prov)
    i += 1
"""


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
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    for trial in range(TRIALS):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, env=env)
        assert writer.stdout.readline() == b"ready\n", f"trial {trial}: writer did not start"
        time.sleep(rng.uniform(0.0, 0.05))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stdout.close()
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
    # The kills must actually land inside writes, or the test proves nothing.
    assert interrupted >= 1
