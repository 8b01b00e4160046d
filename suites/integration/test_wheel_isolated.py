"""The wheel, installed alone into a fresh venv and run isolated, has every module and runs a workload.

``suites.isolated_wheel`` builds the wheel from a copy of this checkout and installs it
into a fresh venv whose only harness is the wheel's (no editable finder, no ``.pth`` of
a checkout, no system site packages); every command runs with ``python -I`` from a
folder outside the checkout. Guards the package list of pyproject.toml: with
``exclude = ["harness.data*"]`` (which also matched ``harness.dataplane``) the import
test fails naming the five ``harness.dataplane`` modules and the modules that import
them, and the workload test fails with ``ModuleNotFoundError: harness.dataplane``.
About 40-60 s on a 2-core box (two workload runs of ~10-15 s each).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from suites.isolated_wheel import IMPORT_ALL, REPO, IsolatedInstall, install_isolated, ok, source_modules

pytestmark = pytest.mark.slow

SMOKE = REPO / "goldens" / "qwen3_moe_tiny_smoke" / "workload.yaml"


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> IsolatedInstall:
    return install_isolated(tmp_path_factory.mktemp("wheel"))


def _import_all(python: list[str], cwd: Path, env: dict | None = None) -> dict:
    import subprocess

    proc = subprocess.run([*python, "-c", IMPORT_ALL, *source_modules()], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_module_of_the_source_tree_imports_from_the_wheel(isolated: IsolatedInstall, tmp_path: Path):
    from suites.isolated_wheel import clean_env

    wheel = _import_all([str(isolated.python), "-I"], tmp_path, clean_env())
    # the harness imported is the wheel's, and nothing of the checkout is reachable
    assert wheel["flags_isolated"] == 1
    assert Path(wheel["file"]).is_relative_to(isolated.site_packages), wheel["file"]
    other = [p for p in wheel["path"] if p and (Path(p) / "harness").exists() and Path(p) != isolated.site_packages]
    assert not other, f"another harness on sys.path: {other}"
    assert not [f for f in wheel["meta_path"] if "editable" in f.lower()], wheel["meta_path"]
    # a module may fail only as it fails from the checkout (an optional backend not installed here),
    # never for want of a harness module
    checkout = _import_all([sys.executable], REPO)
    broken = {name: why for name, why in wheel["result"].items()
              if why is not None and (why != checkout["result"].get(name) or "harness" in why.split(": ", 1)[-1])}
    assert not broken, "modules of the source tree that the installed wheel cannot import:\n" + "\n".join(
        f"  {name}: {why}" for name, why in sorted(broken.items()))
    assert set(wheel["result"]) == set(source_modules())


def _consumer_spec(name: str, *replacements: tuple[str, str]) -> str:
    text = SMOKE.read_text().replace("name: qwen3_moe_tiny_smoke", f"name: {name}")
    text = text.replace("platforms: [cpu, cuda]", "platforms: [cpu]")
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    return text


def test_a_consumer_captures_workloads_with_the_dataplane_and_streaming_trainers(isolated: IsolatedInstall,
                                                                                  tmp_path: Path):
    consumer = tmp_path / "consumer"
    specs = {
        "my_dataplane": _consumer_spec("my_dataplane", ("trainer: sync", "trainer: dataplane")),
        "my_streaming": _consumer_spec("my_streaming", ("async: false", "async: true"), (
            "trainer: sync,", "trainer: streaming, loss: {use_importance_sampling_correction: true},")),
    }
    for name, text in specs.items():
        (consumer / "goldens" / name).mkdir(parents=True)
        (consumer / "goldens" / name / "workload.yaml").write_text(text)
    for name in specs:
        proc = isolated.run(["-m", "harness.cli", "capture", name, "--goldens-root", "goldens"], consumer)
        out = ok(proc, f"golden capture {name} from the wheel")
        assert "golden written: goldens/" + name + "/cpu" in out + proc.stderr
        stored = consumer / "goldens" / name / "cpu"
        manifest = json.loads((stored / "manifest.json").read_text())
        assert manifest["workload"]["name"] == name
        assert (stored / "surfaces" / "rollouts.json").is_file()  # capture on: the token records' surface
