"""Every process of a run executes the driver's harness (harness.code_identity; issue 41 item 5).

Real runs of the smoke workload through the installed ``golden`` command, with a real Ray,
real rank actors and engine processes: a ``harness/`` folder in the working directory is
never imported (before: the fork server and the numerics canary, started with ``python -m``,
and every fresh-interpreter worker imported it, while the manifest recorded the driver's
code), and a worker that does import another harness is refused, naming both."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import code_identity

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SMOKE = "qwen3_moe_tiny_smoke"


def _golden() -> str:
    found = shutil.which("golden", path=str(Path(sys.executable).parent))
    assert found, f"the golden console script is not installed beside {sys.executable}"
    return found


def _copy_harness(dst: Path) -> Path:
    shutil.copytree(code_identity.package_root(), dst / "harness",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dst / "harness"


def _run(cwd: Path, run_dir: Path, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "GOLDEN_PROGRESS": "plain", **(env or {})}
    return subprocess.run([_golden(), "run", SMOKE, "--run-dir", str(run_dir), *overrides], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("zygote", ["1", "0"], ids=["forked-workers", "fresh-interpreter-workers"])
def test_a_harness_folder_in_the_working_directory_is_never_imported(tmp_path, zygote):
    shadow = _copy_harness(tmp_path)
    marker = tmp_path / "imported.txt"
    with open(shadow / "__init__.py", "a") as handle:
        handle.write(f"\nimport os as _o\nwith open({str(marker)!r}, 'a') as _f:\n"
                     "    _f.write(str(_o.getpid()) + '\\n')\n")
    out = _run(tmp_path, tmp_path / "run", env={"GOLDEN_ZYGOTE": zygote})
    assert out.returncode == 0, out.stderr[-3000:]
    assert not marker.exists(), f"processes {marker.read_text().split()} imported {shadow}"
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["code"] == {"digest": code_identity.digest(), "root": str(code_identity.package_root())}


def test_a_worker_running_another_harness_is_refused_naming_both(tmp_path):
    other = _copy_harness(tmp_path / "other")
    with open(other / "ops.py", "a") as handle:
        handle.write("\n# one changed line: another harness\n")
    out = _run(tmp_path, tmp_path / "run", f"plugins.env.PYTHONPATH={other.parent}")
    assert out.returncode == 3, out.stderr[-3000:]
    failed = next(line for line in out.stderr.splitlines() if "FAIL run_completed" in line)
    assert "CodeMismatch" in failed and "policy rank" in failed
    assert code_identity.digest()[:12] in failed and "not the driver's" in failed


def test_the_digest_names_the_files_and_the_check_refuses_a_mismatch(tmp_path):
    copy = _copy_harness(tmp_path)
    probe = ("from harness import code_identity as c; print(c.digest()); print(c.package_root());"
             "c.check_process('the probe')")
    env = {k: v for k, v in os.environ.items() if k not in (code_identity.DIGEST_VAR, code_identity.ROOT_VAR)}

    def digest_of(root: Path, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", probe], cwd=root, env={**env, **extra}, capture_output=True,
                              text=True, timeout=60)

    same = digest_of(tmp_path)
    assert same.returncode == 0 and same.stdout.split()[:2] == [code_identity.digest(), str(copy)]
    (copy / "ops.py").write_text((copy / "ops.py").read_text() + "\n")
    changed = digest_of(tmp_path)
    assert changed.stdout.split()[0] != code_identity.digest()
    refused = digest_of(tmp_path, **code_identity.exported())
    assert refused.returncode != 0 and "CodeMismatch" in refused.stderr and str(copy) in refused.stderr
    assert digest_of(REPO, **code_identity.exported()).returncode == 0  # the same files: not refused
