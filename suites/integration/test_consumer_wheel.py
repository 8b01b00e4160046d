"""A consumer repository gates a built-in workload with the harness installed from its wheel.

The steps of docs/consumer.md, for real: build the wheel from this checkout (no
network, no build isolation), install only that wheel into a fresh folder outside
the checkout (its dependencies are the venv's, already installed), and from an
empty consumer directory (a git repository with one commit), where the checkout
is not importable, run ``pytest -m golden --strict-markers``:

1. no goldens yet: fails, naming the missing goldens root;
2. ``--golden-capture-missing``: runs the workload, stores the golden (provenance
   names the consumer's commit; a copy of the built-in spec goes with it) and
   passes as created, byte-identical to this repository's golden;
3. again: compares against it and passes;
4. a planted change (the consumer's spec seed): fails with findings.

The cheapest built-in workload (qwen3_moe_tiny_smoke: one policy rank, one sync
engine) runs three times; the whole test takes 55-100 s on a 2-core box (load).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suites.stored_goldens import stored_dir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = "qwen3_moe_tiny_smoke"
GATED = ("topology", "lifecycle", "operators", "collectives", "rollouts", "training")
SKIP_IN_COPY = shutil.ignore_patterns(".git", ".venv*", "runs", "build", "reports", "*.egg-info", "__pycache__",
                                      ".pytest_cache", ".hypothesis", ".ruff_cache")

PYPROJECT = f"""\
[project]
name = "my-trainer"
version = "0.0.1"

[tool.golden]
goldens-root = "goldens"
workloads = ["{WORKLOAD}"]
"""

TEST_FILE = """\
import pytest
from harness.pytest_plugin import golden_params


@pytest.mark.golden
@pytest.mark.parametrize("workload,surface", golden_params())
def test_golden(golden, workload, surface):
    golden.check(workload, surface)
"""


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess, what: str) -> str:
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of this checkout, installed (no deps, no index) into a fresh folder."""
    base = tmp_path_factory.mktemp("wheel")
    source, wheels, site = base / "src", base / "dist", base / "site"
    shutil.copytree(REPO, source, symlinks=True, ignore=SKIP_IN_COPY)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
              "-w", str(wheels), str(source)], base, env), "pip wheel")
    (wheel,) = wheels.glob("grpo_golden_harness-*.whl")
    _ok(_run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
             base, env), "pip install --target")
    return site


def test_a_consumer_repository_captures_checks_and_catches_a_planted_change(installed: Path, tmp_path: Path):
    consumer = tmp_path / "consumer"
    (consumer / "tests").mkdir(parents=True)
    (consumer / "pyproject.toml").write_text(PYPROJECT)
    (consumer / "tests" / "test_golden.py").write_text(TEST_FILE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOLDEN_", "PYTEST_", "GIT_"))}
    git = ["git", "-c", "user.name=consumer", "-c", "user.email=consumer@example.invalid"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "gate"]):
        _ok(_run([*git, *step], consumer, env), f"git {step[0]}")
    head = _ok(_run(["git", "rev-parse", "HEAD"], consumer, env), "git rev-parse").strip()
    env.update(PYTHONPATH=str(installed), RAY_AUTH_MODE="disabled", PYTHONDONTWRITEBYTECODE="1")

    probe = "import harness, harness.envs.tokenizer as t; print(harness.__file__); print(t.load_tokenizer().digest)"
    where, digest = _ok(_run([sys.executable, "-c", probe], consumer, env), "import").split()
    assert where.startswith(str(installed)), f"harness imported from the checkout: {where}"
    from harness.envs.tokenizer import load_tokenizer

    assert digest == load_tokenizer().digest  # the packaged tokenizer is the one the goldens record

    pytest_cmd = [sys.executable, "-m", "pytest", "-m", "golden", "--strict-markers", "-p", "no:cacheprovider",
                  "-p", "no:randomly", "tests"]
    goldens = consumer / "goldens"

    # 1. nothing captured yet: one failing test naming the missing root, and nothing written
    first = _run(pytest_cmd, consumer, env)
    assert first.returncode == 1, first.stdout[-3000:]
    assert f"goldens root {goldens} does not exist (from {consumer / 'pyproject.toml'} [tool.golden]" in first.stdout
    assert "1 failed" in first.stdout and "skipped" not in first.stdout
    assert not goldens.exists()

    # 2. first capture: explicit, passes as created, with provenance and the spec copied into the root
    created = _ok(_run([*pytest_cmd, "-v", "--golden-capture-missing"], consumer, env), "capture")
    assert "6 passed" in created and f"{WORKLOAD:<36} cpu      created" in created
    assert created.count(f"test_golden[{WORKLOAD}-") == created.count("CREATED") == 6
    stored = goldens / WORKLOAD / "cpu"
    provenance = json.loads((stored / "PROVENANCE.json").read_text())
    assert provenance["reason"] == "first capture (pytest --golden-capture-missing)"
    # the consumer repository's commit (not the harness's: an installed wheel has none)
    assert provenance["repository"]["commit"] == head and provenance["repository"]["goldens_root"] == "goldens"
    assert provenance["commit"] is None
    assert (goldens / WORKLOAD / "workload.yaml").read_bytes() == (REPO / "goldens" / WORKLOAD / "workload.yaml"
                                                                    ).read_bytes()
    # the wheel's code and data give the repository's own golden, byte for byte
    for surface in GATED:
        assert (stored / "surfaces" / f"{surface}.json").read_bytes() == (
            stored_dir(WORKLOAD) / "surfaces" / f"{surface}.json").read_bytes(), surface

    # 3. a later run compares against it
    again = _ok(_run(pytest_cmd, consumer, env), "check")
    assert "6 passed" in again and f"{WORKLOAD:<36} cpu      parity" in again

    # 4. a planted change in the consumer's workload fails the gate, with findings and the refresh hint
    spec = goldens / WORKLOAD / "workload.yaml"
    spec.write_text(spec.read_text().replace("seed: 1234", "seed: 1235"))
    planted = _run(pytest_cmd, consumer, env)
    assert planted.returncode == 1, planted.stdout[-3000:]
    assert f"{WORKLOAD}/training: fail" in planted.stdout and f"{WORKLOAD:<36} cpu      fail" in planted.stdout
    assert f"golden refresh {WORKLOAD} --platform cpu --reason TEXT" in planted.stdout
