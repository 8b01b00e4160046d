"""megatron's local experts as two grouped GEMMs (``harness.policy.megatron.grouped_experts``,
the cuda path of issue 20) compute what megatron's ``SequentialMLP`` loop computes.

Real megatron-core engine on the CPU (compatibility layer), one rank; the grouped side runs
torch's CPU ``_grouped_mm`` (the engine takes the grouped path only on cuda, so on the CPU
an installed module must still run megatron's loop bit for bit). The cuda comparison is in
``suites/unit/test_grouped_experts.py``'s device tests' spirit: the medium megatron golden,
refreshed and re-checked on the H200 (docs/gpu.md). Skipped unless megatron-core is importable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.policy.synthetic import synthetic_batch
from harness.spec import load_spec
from suites.local_world import spawn_world, with_layout
from suites.optional import MEGATRON
from suites.policy_jobs import grouped_experts_job

pytestmark = [MEGATRON, pytest.mark.megatron]

REPO = Path(__file__).resolve().parents[2]


def test_grouped_experts_equal_megatrons_loop_and_the_cpu_keeps_the_loop():
    spec = load_spec(str(REPO / "goldens/qwen3_moe_tiny_tp2pp2cp2ep2/workload.yaml"))
    spec = with_layout(spec, tp=1, pp=1, cp=1, ep=1, etp=1, dp=1, pp_layout=None, backend="megatron")
    (res,) = spawn_world(spec, grouped_experts_job, synthetic_batch(spec, 4, seed=0), timeout_s=240.0)
    assert res["unsupported"] is None and res["experts"] > 3
    torch.testing.assert_close(res["grouped"], res["loop"], rtol=1e-5, atol=1e-6)
    assert len(res["grouped_grads"]) == 2 * res["experts"]
    for got, want in zip(res["grouped_grads"], res["loop_grads"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.count_nonzero(res["grouped_grads"][2]) == 0  # expert 1 got no tokens: zero gradient
    assert res["installed"] == res["layers"]  # one SequentialMLP per layer
    assert torch.equal(res["routed_on_cpu"], res["loop"])  # installed, but on the CPU: megatron's loop
