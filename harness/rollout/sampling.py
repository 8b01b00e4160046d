"""Seeded token sampling for one request row.

Logprob convention (documented choice): the reported logprob of a sampled
token is its log-probability under the distribution it was sampled from:
``log_softmax(logits / temperature)``, restricted to the top-p nucleus and
renormalised when ``top_p < 1``. With ``top_p == 1`` this is exactly the
temperature-scaled policy logprob that GRPO compares against (vLLM's
``processed_logprobs``). Greedy decoding (``temperature == 0``) picks the
first maximal logit and reports ``log_softmax(logits)`` of it.

Randomness: one uniform draw (float64) per sampled token from the request's
own ``torch.Generator``, mapped through the CDF of the sorted-by-id
distribution; so a request's tokens depend only on its seed and its logits.
"""

from __future__ import annotations

import torch


def sample_token(
    logits: torch.Tensor, *, temperature: float, top_p: float, generator: torch.Generator
) -> tuple[int, float]:
    """Sample from one row of logits ``[V]``; return ``(token_id, logprob)``."""
    logits = logits.to(torch.float32)
    if temperature == 0.0:
        logp = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits).item())
        return token, float(logp[token].item())
    logp = torch.log_softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_logp, order = torch.sort(logp, descending=True, stable=True)
        probs = sorted_logp.exp()
        mass_before = torch.cumsum(probs, dim=0) - probs
        keep = order[mass_before < top_p]  # the most likely token is always kept
        nucleus = torch.full_like(logp, float("-inf"))
        nucleus[keep] = logp[keep]
        logp = torch.log_softmax(nucleus, dim=-1)
    cdf = torch.cumsum(logp.to(torch.float64).exp(), dim=0)
    u = torch.rand((), generator=generator, dtype=torch.float64) * cdf[-1]
    token = int(torch.searchsorted(cdf, u.reshape(1), right=True).clamp_max(logp.numel() - 1).item())
    return token, float(logp[token].item())
