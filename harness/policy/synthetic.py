"""A deterministic GRPO train batch for a spec (no Ray, no process group).

``synthetic_batch(spec, batch_size, seed)`` is what the parity tests, the step
benchmark and the worker-environment smoke step (``harness.workerenv.smoke``) train on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness import ops
from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.spec.typed import as_workload


def synthetic_batch(spec: Mapping[str, Any], batch_size: int, seed: int) -> dict[str, torch.Tensor]:
    """A deterministic GRPO train batch `[batch_size, seq_len]`: random prompt
    and response tokens, right padding, a token mask on the response,
    advantages per sample, and prev/generation/reference logprobs from the
    initial reference model (so ratios start at 1)."""
    spec = as_workload(spec)
    cfg = ModelConfig.from_spec(spec.model)
    seq = spec.policy.seq_len
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab, (batch_size, seq), generator=g)
    prompt = torch.randint(seq // 8, seq // 4, (batch_size,), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (batch_size,), generator=g)
    pos = torch.arange(seq).unsqueeze(0)
    token_mask = ((pos >= prompt[:, None]) & (pos < lengths[:, None])).to(torch.float32)
    ids = torch.where(pos < lengths[:, None], ids, torch.zeros_like(ids))
    adv = torch.randn(batch_size, generator=g)
    with torch.no_grad():
        ref = build_reference_model(cfg, spec.seed)
        lp = ops.token_logprobs(ref(ids)[0], ids)
    return {
        "input_ids": ids,
        "input_lengths": lengths,
        "token_mask": token_mask,
        "sample_mask": torch.ones(batch_size),
        "advantages": adv[:, None].expand(batch_size, seq).contiguous(),
        "prev_logprobs": lp.clone(),
        "generation_logprobs": lp.clone(),
        "reference_policy_logprobs": lp.clone(),
    }
