"""Golden platforms: which device a run uses and which goldens a plain pytest run selects.

Pure spec logic (no run is started): a platform that names a device runs the
workload there, other platform names only select the golden, and a plain
``pytest -m golden`` on this CPU host never schedules a cuda-only workload.
"""

from __future__ import annotations

from pathlib import Path

from harness.flows import spec_for_platform
from harness.pytest_plugin import golden_params

ROOT = Path(__file__).resolve().parents[2] / "goldens"


def _workloads(params) -> set[str]:
    return {p.values[0] for p in params}


def test_device_platform_overrides_the_spec_device(monkeypatch):
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    assert spec_for_platform("qwen3_moe_tiny_smoke", goldens_root=ROOT)["platform"]["device"] == "cpu"
    cuda = spec_for_platform("qwen3_moe_tiny_smoke", platform="cuda", goldens_root=ROOT)
    assert cuda["platform"]["device"] == "cuda"
    monkeypatch.setenv("GOLDEN_PLATFORM", "cuda")
    assert spec_for_platform("qwen3_moe_tiny_smoke", goldens_root=ROOT)["platform"]["device"] == "cuda"


def test_non_device_platform_only_selects_the_golden(monkeypatch):
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    spec = spec_for_platform("qwen3_moe_tiny_smoke", platform="cpu-vllm", goldens_root=ROOT)
    assert spec["platform"]["device"] == "cpu"


def test_plain_golden_run_schedules_cpu_workloads_only(monkeypatch):
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    names = _workloads(golden_params(ROOT))
    assert "qwen3_moe_tiny_smoke" in names and "qwen3_moe_tiny_tp2pp2cp2ep2" in names
    assert "qwen3_moe_medium_megatron" not in names  # scheduled on cuda only
    assert "nemo_rl_qwen3_235b" not in names  # planned only


def test_cuda_golden_run_schedules_cuda_workloads(monkeypatch):
    monkeypatch.setenv("GOLDEN_PLATFORM", "cuda")
    names = _workloads(golden_params(ROOT))
    assert names == {"qwen3_moe_tiny_smoke", "qwen3_moe_medium_megatron", "qwen3_moe_medium_vllm",
                     "qwen3_moe_tiny_smoke_bf16"}
