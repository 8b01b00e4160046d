"""`golden validate | diff | lint` end to end, and their subprocesses import neither torch nor ray."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli import main
from harness.manifest import artifact_entry, surface_entry
from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.store import new_provenance, write_golden
from harness.surfaces import surface_file_bytes

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "manifests_invalid"


def make_run(run: Path, docs: dict) -> Path:
    """A run directory as postflight leaves it: one artifact, surfaces/*.json, manifest.json."""
    (run / "artifacts/policy").mkdir(parents=True)
    (run / "artifacts/policy/rank00000.trace.jsonl").write_text('{"seq":0}\n')
    (run / "surfaces").mkdir()
    for name, doc in docs.items():
        (run / "surfaces" / f"{name}.json").write_bytes(surface_file_bytes(doc))
    manifest = synthetic_manifest("w")
    manifest["artifacts"] = [artifact_entry(run, "artifacts/policy/rank00000.trace.jsonl", role="policy", rank=0)]
    manifest["surfaces"] = [surface_entry(run, name) for name in sorted(docs)]
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return run


@pytest.fixture
def setup(tmp_path):
    docs = synthetic_surfaces("w", seed=5)
    run = make_run(tmp_path / "run", docs)
    golden = write_golden(tmp_path / "goldens", "w", "cpu", json.loads((run / "manifest.json").read_text()), docs,
                          new_provenance(commit=None, reason="test", command="pytest", environment={}))
    return tmp_path, run, golden, docs


def test_validate_accepts_manifest_run_dir_and_golden_dir(setup, capsys):
    _, run, golden, _ = setup
    for path in (run / "manifest.json", run, golden):
        assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "(manifest)" in out and "(run directory)" in out and "(golden directory)" in out


def test_validate_prints_pointer_and_exits_1(capsys, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "_run", run)
    shutil.copy(FIXTURES / "artifact_sha_mismatch.json", run / "manifest.json")
    assert main(["validate", str(run)]) == 1
    assert f"{run / 'manifest.json'}#/artifacts/0/sha256: " in capsys.readouterr().out


def test_validate_checks_golden_surfaces_against_schema_and_sha(setup, capsys):
    _, _, golden, _ = setup
    (golden / "surfaces/training.json").write_text('{"surface": "training"}\n')
    (golden / "surfaces/extra.json").write_text("{}\n")
    assert main(["validate", str(golden)]) == 1
    out = capsys.readouterr().out
    assert "#/surfaces/" in out and "sha256 mismatch" in out
    assert "training.json#: 'version' is a required property" in out
    assert "extra.json: not listed in manifest.json" in out


def test_validate_unusable_path_exits_2(tmp_path):
    assert main(["validate", str(tmp_path / "nope")]) == 2
    assert main(["validate", str(tmp_path)]) == 2


def test_diff_parity_exits_0(setup, capsys):
    _, run, golden, _ = setup
    assert main(["diff", str(run), str(golden)]) == 0
    assert "PARITY" in capsys.readouterr().out


def test_diff_findings_exit_1_in_every_format(setup, tmp_path):
    _, _, golden, docs = setup
    changed = copy.deepcopy(docs)
    changed["operators"]["sections"]["policy/rank00001"]["phases"]["train/step1"]["operators"]["aten::op_004"] += 1
    run2 = make_run(tmp_path / "run2", changed)
    for fmt in ("terminal", "markdown", "json", "junit"):
        out = tmp_path / f"report.{fmt}"
        assert main(["diff", str(run2), str(golden), "--format", fmt, "--output", str(out)]) == 1
        text = out.read_text()
        assert "aten::op_004" in text
    assert json.loads((tmp_path / "report.json").read_text())["status"] == "fail"
    ET.fromstring((tmp_path / "report.junit").read_text())


def test_diff_by_workload_name_and_platform(setup, capsys):
    root, run, _, _ = setup
    assert main(["diff", str(run / "manifest.json"), "w", "--goldens-root", str(root / "goldens")]) == 0
    assert main(["diff", str(run), "w", "--goldens-root", str(root / "goldens"), "--platform", "cuda"]) == 2


def test_diff_unusable_inputs_exit_2(setup, tmp_path):
    _, run, golden, _ = setup
    assert main(["diff", str(tmp_path / "missing"), str(golden)]) == 2
    (run / "surfaces/training.json").write_text(
        '{"surface": "training", "sections": {"step0001": {"metrics": {"loss": NaN}}}}'
    )
    assert main(["diff", str(run), str(golden)]) == 2


def test_diff_nondeterministic_lane(setup, tmp_path):
    _, _, golden, docs = setup
    drift = copy.deepcopy(docs)
    drift["training"]["sections"]["step0001"]["metrics"]["loss"] *= 1.0001
    run = make_run(tmp_path / "drift", drift)
    assert main(["diff", str(run), str(golden), "--format", "json", "--output", str(tmp_path / "v.json")]) == 1
    assert json.loads((tmp_path / "v.json").read_text())["status"] == "stale"
    assert main(["diff", str(run), str(golden), "--nondeterministic"]) == 0


def test_lint_exit_codes(setup, capsys):
    root, _, _, _ = setup
    assert main(["lint", "--goldens-root", str(root / "goldens")]) == 1  # golden w has no workload.yaml
    assert "orphan_golden: w/cpu" in capsys.readouterr().out
    assert main(["lint", "--goldens-root", str(root / "absent")]) == 2


WRAPPER = r"""
import runpy, sys, json
sys.argv = ["golden"] + sys.argv[1:]
try:
    runpy.run_module("harness", run_name="__main__")
    code = 0
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "ray": "ray" in sys.modules}), file=sys.stderr)
"""


def _probe(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, timeout=120, cwd=REPO)
    return json.loads(proc.stderr.strip().splitlines()[-1])


def test_gate_commands_in_a_subprocess_import_neither_torch_nor_ray(setup):
    _, run, golden, _ = setup
    probes = {
        "validate": _probe("validate", str(golden)),
        "diff": _probe("diff", str(run), str(golden)),
        "plan": _probe("plan", "nemo_rl_qwen3_235b"),
    }
    assert {k: v["code"] for k, v in probes.items()} == {"validate": 0, "diff": 0, "plan": 0}
    assert {k: (v["torch"], v["ray"]) for k, v in probes.items()} == dict.fromkeys(probes, (False, False))


def test_diff_by_workload_name_takes_the_golden_platform_from_the_runs_spec(tmp_path, monkeypatch):
    """A real run's manifest says environment.platform = the host (linux-x86_64);
    the golden platform comes from its run.json spec (here vLLM on cpu: cpu-vllm)."""
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    docs = synthetic_surfaces("w", seed=5)
    run = make_run(tmp_path / "run", docs)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["environment"]["platform"] = "linux-x86_64"
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "run.json").write_text(json.dumps({"status": "completed",
                                              "spec": {"platform": {"device": "cpu"}, "rollout": {"backend": "vllm"}}}))
    write_golden(tmp_path / "goldens", "w", "cpu-vllm", manifest, docs,
                 new_provenance(commit=None, reason="test", command="pytest", environment={}))
    assert main(["diff", str(run), "w", "--goldens-root", str(tmp_path / "goldens")]) == 0
    (run / "run.json").unlink()  # no spec: environment.device (cpu) has no golden here
    assert main(["diff", str(run), "w", "--goldens-root", str(tmp_path / "goldens")]) == 2


@pytest.mark.parametrize("damage", ["deleted", "edited"])
def test_diff_against_a_damaged_golden_is_unusable_input(setup, capsys, damage):
    _, run, golden, _ = setup
    training = golden / "surfaces" / "training.json"
    if damage == "deleted":
        training.unlink()  # used to read as "training surface added" (exit 1)
    else:
        training.write_bytes(training.read_bytes().replace(b'"step0001"', b'"step0009"'))
    assert main(["diff", str(run), str(golden)]) == 2
    assert str(training) in capsys.readouterr().err


def test_validate_a_golden_missing_its_provenance(setup, capsys):
    """goldens/<w>/<platform> without PROVENANCE.json is still judged as a golden
    (one error: the missing file), not as a run directory missing its artifacts."""
    _, _, golden, _ = setup
    (golden.parent / "workload.yaml").write_text("name: w\n")
    (golden / "PROVENANCE.json").unlink()
    assert main(["validate", str(golden)]) == 1
    captured = capsys.readouterr()
    assert captured.out.strip() == f"{golden / 'PROVENANCE.json'}: missing"
    assert "(golden directory)" in captured.err


def test_diff_output_under_a_file_is_a_usage_error(setup, tmp_path, capsys):
    _, run, golden, _ = setup
    (tmp_path / "afile").write_text("x")
    assert main(["diff", str(run), str(golden), "--output", str(tmp_path / "afile" / "r.md")]) == 2
    assert "--output" in capsys.readouterr().err
