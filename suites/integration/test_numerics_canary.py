"""The numerics canary (harness.portable.canary / drift): this machine's pinned kernels give
the stored canary's bits; a process forced onto other code paths behind the harness's back
is refused as environment drift (exit 3, the moved ops named) before any workload starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.portable import drift, pins
from harness.spec.load import default_goldens_root

pytestmark = pytest.mark.skipif(not pins.applies(), reason="the pins apply to x86-64 machines")
ROOT = Path(__file__).resolve().parents[2]


def _pinned_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    pins.apply_to_environ(env)
    env.update(extra)
    return env


def test_this_machine_gives_the_stored_canary_bits():
    line = drift.check(default_goldens_root(), _pinned_env())
    assert line.startswith("numerics canary: ") and "ops bit-equal" in line


def test_a_tampered_canary_op_is_named_as_drift(tmp_path):
    stored = drift.read(default_goldens_root())
    stored["ops"]["sgemm_128x64x256"] = "0" * 16
    (tmp_path / drift.CANARY_FILE).write_text(json.dumps(stored))
    with pytest.raises(drift.Drift) as caught:
        drift.check(tmp_path, _pinned_env())
    assert caught.value.moved == ["sgemm_128x64x256"] and "environment drift" in str(caught.value)


def test_a_forced_code_path_refuses_the_check_with_no_verdict(tmp_path):
    """A ``sitecustomize`` that rewrites ATEN_CPU_CAPABILITY in every interpreter (after the
    harness pinned the environment) stands for a launcher or image that changes the code paths
    behind the harness's back: ``golden check`` exits 3 naming the ops, before Ray starts."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['ATEN_CPU_CAPABILITY'] = 'default'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    run_dir = tmp_path / "run"
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "harness.cli", "check", "qwen3_moe_tiny_smoke", "--run-dir",
                          str(run_dir), "-q"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    elapsed = time.perf_counter() - t
    print(f"forced ATEN_CPU_CAPABILITY=default: exit {out.returncode} in {elapsed:.1f}s")
    assert out.returncode == 3, out.stderr[-2000:]
    assert "numerics canary" in out.stderr and "environment drift" in out.stderr
    assert "exp" in out.stderr and "ATen DEFAULT" in out.stderr  # the moved ops and the child's state
    assert not run_dir.exists()  # refused before the run started


def test_capture_stores_a_canary_where_the_root_has_none(tmp_path):
    root = tmp_path / "goldens"
    root.mkdir()
    assert drift.read(root) is None
    assert "none stored" in drift.check(root, _pinned_env())
    measured = drift.measure(_pinned_env())
    drift.store(root, measured, {"model_name": "test"})
    assert drift.read(root)["ops"] == measured["ops"] and drift.check(root, _pinned_env()).endswith(drift.CANARY_FILE)
    shutil.rmtree(root)
