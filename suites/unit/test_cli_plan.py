"""`golden plan` and `golden list` as a user runs them: in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.store import new_provenance, write_golden

REPO = Path(__file__).resolve().parents[2]


def golden(*args: str, root: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ}
    env.pop("GOLDEN_ROOT", None)
    if root is not None:
        env["GOLDEN_ROOT"] = str(root)
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_plan_235b_text():
    proc = golden("plan", "nemo_rl_qwen3_235b")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "nodes     17 (1 CPU head + 16 x 4 cuda), devices used 64/64" in out
    assert "world 64 = tp2 x cp2 x dp4 x pp4" in out
    assert "etp1 x ep16 x edp1" in out
    assert "stage layers [23, 24, 24, 23]" in out
    assert "world 8 = 1 engine(s) x tp8 x pp1, colocated, async vllm" in out
    assert "235,093,634,560 total, 22,190,763,520 active" in out
    assert "512 samples/step" in out
    # one table row per policy rank and per rollout rank
    policy_rows = out.split("policy ranks")[1].split("policy groups")[0].strip().splitlines()[1:]
    assert len(policy_rows) == 64
    assert policy_rows[63].split()[:3] == ["63", "16", "3"]
    assert "  ep        4 x 16: [0..15] [16..31] [32..47] [48..63]" in out


def test_plan_json_with_override():
    proc = golden("plan", "qwen3_moe_tiny_tp2pp2cp2ep2", "policy.ep=4", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["policy_sizes"]["ep"] == 4 and doc["summary"]["policy_sizes"]["edp"] == 1
    assert doc["topology"]["policy"]["groups"]["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(doc["spec_digest"]) == 64
    base = json.loads(golden("plan", "qwen3_moe_tiny_tp2pp2cp2ep2", "--json").stdout)
    assert base["spec_digest"] != doc["spec_digest"]


def test_plan_bad_input_exits_2_naming_the_field():
    proc = golden("plan", "qwen3_moe_tiny_tp2pp2cp2ep2", "policy.ep=3")
    assert proc.returncode == 2
    assert "policy.ep" in proc.stderr and "model.experts % policy.ep == 0" in proc.stderr
    proc = golden("plan", "no_such_workload")
    assert proc.returncode == 2 and "no_such_workload" in proc.stderr
    proc = golden("plan", "qwen3_moe_tiny_smoke", "policy.tp")
    assert proc.returncode == 2 and "key.path=value" in proc.stderr


def test_list_shows_platforms_and_stored_goldens(tmp_path):
    for name, platforms in (("alpha", "[cpu]"), ("beta", "[]"), ("gamma", "[cpu, cuda-h100x8]")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "workload.yaml").write_text(
            f"name: {name}\nmodel: {{layers: 4, hidden: 64, heads: 8, kv_heads: 2, head_dim: 16, experts: 8,"
            f" top_k: 2, moe_intermediate: 32, vocab: 256}}\nplatform: {{platforms: {platforms}}}\n")
    for name in ("alpha", "beta"):  # a stored golden holds its own workload's name in every document
        write_golden(tmp_path, name, "cpu", synthetic_manifest(name), synthetic_surfaces(name),
                     new_provenance(commit=None, reason="test", command="test", environment={}))
    (tmp_path / "gamma" / "cpu").mkdir()  # folder without a manifest: no golden
    proc = golden("list", "--json", root=tmp_path)
    assert proc.returncode == 0, proc.stderr
    by_name = {e["workload"]: e for e in json.loads(proc.stdout)["workloads"]}
    assert by_name["alpha"]["stored"] == ["cpu"] and by_name["alpha"]["missing"] == []
    assert by_name["beta"]["platforms"] == [] and by_name["beta"]["unscheduled"] == ["cpu"]
    assert by_name["gamma"]["missing"] == ["cpu", "cuda-h100x8"]
    text = golden("list", root=tmp_path).stdout
    assert "planned only" in text and "cpu: MISSING" in text and "3 workloads" in text
    assert all(not e["damaged"] for e in by_name.values())


def test_list_names_a_damaged_golden_and_fails(tmp_path):
    src, dst = REPO / "goldens" / "qwen3_moe_tiny_smoke", tmp_path / "qwen3_moe_tiny_smoke"
    dst.mkdir()
    shutil.copy(src / "workload.yaml", dst / "workload.yaml")
    shutil.copytree(src / "cpu", dst / "cpu")
    surface = dst / "cpu" / "surfaces" / "training.json"
    surface.write_text(surface.read_text().replace("0", "1", 1))  # a hand edit
    proc = golden("list", "--json", root=tmp_path)
    assert proc.returncode == 2
    (entry,) = json.loads(proc.stdout)["workloads"]
    assert "training.json" in entry["damaged"]["cpu"] and "sha256" in entry["damaged"]["cpu"]
    proc = golden("list", root=tmp_path)
    assert proc.returncode == 2 and "cpu: DAMAGED" in proc.stdout and "qwen3_moe_tiny_smoke/cpu" in proc.stderr


def test_list_repo_goldens_and_invalid_workload(tmp_path):
    proc = golden("list")
    assert proc.returncode == 0, proc.stderr
    assert "nemo_rl_qwen3_235b" in proc.stdout and "planned only" in proc.stdout
    assert "qwen3_moe_tiny_tp2pp2cp2ep2" in proc.stdout
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "workload.yaml").write_text("name: broken\nmodel: {layers: 4}\n")
    proc = golden("list", root=tmp_path)
    assert proc.returncode == 2
    assert "INVALID" in proc.stdout and "model.hidden" in proc.stdout
