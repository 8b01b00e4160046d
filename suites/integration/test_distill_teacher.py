"""The teacher's logits: a TP2 (sequence-parallel) teacher's vocab shards, concatenated in TP
order, are the single-process reference model's logits (``harness.model``), in real gloo ranks."""

from __future__ import annotations

import torch

from harness.distill.teacher import logits_job
from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.spec import load_spec
from harness.spec.distill import teacher_spec
from suites.local_world import spawn_world


def test_tp2_teacher_logits_are_the_reference_models():
    tspec = teacher_spec(load_spec("qwen3_moe_tiny_distill"))
    assert (tspec["policy"]["tp"], tspec["policy"]["sp"], tspec["seed"]) == (2, True, 4321)
    seq = tspec["policy"]["seq_len"]
    ids = torch.randint(0, tspec["model"]["vocab"], (2, seq), generator=torch.Generator().manual_seed(3))
    shards = spawn_world(tspec, logits_job, ids)
    assert [tuple(s.shape) for s in shards] == [(2, seq, tspec["model"]["vocab"] // 2)] * 2
    with torch.no_grad():
        ref = build_reference_model(ModelConfig.from_spec(tspec), tspec["seed"])(ids)[0]
    torch.testing.assert_close(torch.cat(shards, dim=-1), ref, rtol=1e-4, atol=1e-5)
