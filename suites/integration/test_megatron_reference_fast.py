"""The megatron engine's two start-up/step shortcuts are exact (issue 20, medium cuda golden):

* ``reference_state_dict`` (the initial weights without building the reference model's
  modules) equals ``build_reference_model(...).state_dict()`` bit for bit (fp32 and bf16);
* in a 1-rank world, the reference logprobs before any training come from the last
  ``get_logprobs`` of the same ids (no second forward) and equal the weight-swap path's
  bit for bit; after a step (or a checkpoint load) the swap path runs again.

Real megatron-core engine on the CPU (compatibility layer), one rank. Skipped unless
megatron-core is importable."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model, reference_state_dict
from harness.policy.synthetic import synthetic_batch
from harness.spec import load_spec
from suites.local_world import spawn_world, with_layout
from suites.optional import MEGATRON
from suites.policy_jobs import reference_shortcut_job, warm_forward_job

pytestmark = [MEGATRON, pytest.mark.megatron]

REPO = Path(__file__).resolve().parents[2]


def _spec():
    spec = load_spec(str(REPO / "goldens/qwen3_moe_tiny_tp2pp2cp2ep2/workload.yaml"))
    return with_layout(spec, tp=1, pp=1, cp=1, ep=1, etp=1, dp=1, pp_layout=None, backend="megatron")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_state_dict_is_the_reference_models(dtype):
    cfg = ModelConfig.from_spec(_spec()["model"])
    cfg = dataclasses.replace(cfg, dtype=dtype)
    fast, full = reference_state_dict(cfg, 1234), build_reference_model(cfg, 1234).state_dict()
    assert list(fast) == list(full)
    for name, value in full.items():
        assert fast[name].dtype == value.dtype and fast[name].shape == value.shape, name
        assert torch.equal(fast[name], value), name
    assert not torch.equal(reference_state_dict(cfg, 1235)[name], value)  # the seed matters


def test_untrained_reference_logprobs_skip_the_second_forward(tmp_path):
    spec = _spec()
    batch = synthetic_batch(spec, 8, seed=0)
    (res,) = spawn_world(spec, reference_shortcut_job, batch, timeout_s=240.0)
    assert res["fast_runs"] == 0 and res["swapped_runs"] == 1 and res["trained_reference_runs"] == 1
    assert torch.equal(res["fast"], res["swapped"])
    assert torch.equal(res["fast"], res["logprobs"])
    assert torch.equal(res["trained_reference"], res["swapped"])
    assert not torch.equal(res["trained"], res["logprobs"])  # the step moved the weights


def test_the_warm_forward_changes_no_later_result():
    """``warm_forward`` (run at start-up by a 1-rank cuda engine; here called on the CPU) is one
    forward schedule that leaves the logprobs and the untrained-logprobs cache as they were."""
    spec = _spec()
    batch = synthetic_batch(spec, 8, seed=0)
    (res,) = spawn_world(spec, warm_forward_job, batch, timeout_s=240.0)
    assert res["warm_runs"] == 1 and res["cache_kept"]
    assert torch.equal(res["before"], res["after"])
