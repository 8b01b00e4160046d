"""On-policy distillation math: the student's reverse-KL term to a teacher (pure torch).

The rollouts are sampled from the student (the rollout engine holds the
student's weights), so the per-token estimate of the *reverse* KL

    KL(pi_student || pi_teacher) = E_{x ~ pi_student}[log pi_student(x) - log pi_teacher(x)]

is formed on the sampled tokens from two logprobs per token: the student's
current logprob ``s`` and the teacher's ``t`` (``t`` from the teacher's logits,
:func:`token_logprobs_from_logits`). With ``logr = t - s`` the estimators are
those of ``harness.algos.kl`` (``k1 = s - t``, ``k2 = logr**2 / 2``,
``k3 = exp(logr) - 1 - logr``); k1 and k3 are unbiased for the reverse KL
under student samples, and k3 is >= 0 and exactly 0 where ``s == t``.

As for GRPO's reference KL, the estimate is multiplied by the score-function
weight ``exp(s - s.detach())`` (value 1; the gradient of the expectation over
the student's own samples) and reduced over the generated tokens with the
*global* valid-token count, so microbatch terms add up to the batch term:

    distill_kl = sum(kl(s, t) * mask) / global_valid_toks
    loss       = grpo_loss + coef * distill_kl

``mask = token_mask[:, 1:] * sample_mask[:, None]`` (the GRPO loss mask).
Tensors follow the design's alignment: ``[B, S]`` with column 0 unused.
"""

from __future__ import annotations

import torch

from harness.algos.kl import KL_TYPES, calculate_kl
from harness.algos.masked import masked_mean

# Which KL the distillation term estimates (docs/distill.md); only the reverse KL is
# built: the samples come from the student, which is what makes the estimate on-policy.
DISTILL_KL_DIRECTIONS: tuple[str, ...] = ("reverse",)


def token_logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor, *,
                               temperature: float = 1.0) -> torch.Tensor:
    """``[B, S]`` logprobs of ``input_ids`` under ``logits [B, S, V]`` (entry ``t`` predicts ``t + 1``).

    ``out[b, t] = log_softmax(logits[b, t - 1] / temperature)[input_ids[b, t]]`` for ``t >= 1``;
    column 0 is 0 (the design's alignment). Computed in float32.
    """
    if logits.dim() != 3 or input_ids.dim() != 2 or tuple(logits.shape[:2]) != tuple(input_ids.shape):
        raise ValueError(f"logits {tuple(logits.shape)} must be [B, S, V] over input_ids {tuple(input_ids.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    lp = torch.log_softmax(logits[:, :-1].to(torch.float32) / temperature, dim=-1)
    picked = lp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)


def distill_kl_term(
    curr_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    global_valid_toks: torch.Tensor | float,
    *,
    kl_type: str = "k3",
    input_clamp: float | None = 20.0,
    output_clamp: float | None = 10.0,
) -> torch.Tensor:
    """The (uncoefficiented) reverse-KL term ``sum(kl * mask) / global_valid_toks``, a scalar.

    Differentiable w.r.t. ``curr_logprobs`` only (the teacher's logprobs are
    detached). ``kl_type`` in ``harness.algos.kl.KL_TYPES`` (ValueError otherwise).
    """
    if kl_type not in KL_TYPES:
        raise ValueError(f"distill.kl_type must be one of {list(KL_TYPES)}, got {kl_type!r}")
    shape = tuple(curr_logprobs.shape)
    for name, t in (("teacher_logprobs", teacher_logprobs), ("token_mask", token_mask)):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
    curr = curr_logprobs[:, 1:]
    teacher = teacher_logprobs[:, 1:].detach().to(curr.dtype)
    mask = token_mask[:, 1:].to(curr.dtype) * sample_mask.to(curr.dtype)[:, None]
    score_weights = torch.nan_to_num(torch.exp(curr - curr.detach()), nan=0.0, posinf=0.0, neginf=0.0)
    kl = calculate_kl(curr, teacher, kl_type=kl_type, input_clamp=input_clamp, output_clamp=output_clamp,
                      importance_weights=score_weights)
    return masked_mean(kl, mask, global_valid_toks)
