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

from harness.devices import moved


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
    u = moved(torch.rand((), generator=generator, dtype=torch.float64), cdf.device) * cdf[-1]  # CPU generator
    token = int(torch.searchsorted(cdf, u.reshape(1), right=True).clamp_max(logp.numel() - 1).item())
    return token, float(logp[token].item())


def sample_rows(
    logits: torch.Tensor,
    *,
    temperatures: list[float],
    top_ps: list[float],
    generators: list[torch.Generator],
) -> tuple[list[int], list[float]]:
    """``sample_token`` for every row of ``logits [B, V]``; row ``i`` bit-identical to
    ``sample_token(logits[i], temperature=temperatures[i], top_p=top_ps[i], generator=generators[i])``.

    Greedy rows and ``top_p == 1`` rows are handled together with row-local
    kernels (log-softmax, argmax, cumsum, searchsorted) and exactly rounded
    element-wise ops; the float64 ``exp`` is batched only when ``V`` is a
    multiple of 16, so every row runs in whole vector chunks as it does alone
    (a scalar tail could round differently). Nucleus rows (``top_p < 1``) and
    anything else go through ``sample_token`` one by one. Each row draws from
    its own generator, one uniform per token, as ``sample_token`` does.
    """
    n, vocab = logits.shape
    logits = logits.to(torch.float32)
    tokens: list[int] = [0] * n
    logprobs: list[float] = [0.0] * n
    greedy = [i for i in range(n) if temperatures[i] == 0.0]
    plain = [i for i in range(n) if temperatures[i] != 0.0 and top_ps[i] >= 1.0] if vocab % 16 == 0 else []
    done = set(greedy) | set(plain)
    if greedy:
        rows = logits if len(greedy) == n else logits[greedy]
        picked = rows.argmax(dim=-1, keepdim=True)
        lp = torch.log_softmax(rows, dim=-1).gather(-1, picked)
        for i, tok, val in zip(greedy, picked.view(-1).tolist(), lp.view(-1).tolist()):
            tokens[i], logprobs[i] = tok, val
    if plain:
        rows = logits if len(plain) == n else logits[plain]
        temps = torch.tensor([float(temperatures[i]) for i in plain], dtype=torch.float32, device=logits.device)
        logp = torch.log_softmax(rows / temps.view(-1, 1), dim=-1)
        cdf = torch.cumsum(logp.to(torch.float64).exp(), dim=-1)
        u = moved(
            torch.stack([torch.rand((), generator=generators[i], dtype=torch.float64) for i in plain]), cdf.device
        )
        u = (u * cdf[:, -1]).view(-1, 1)
        picked = torch.searchsorted(cdf, u, right=True).clamp_max(vocab - 1)
        lp = logp.gather(-1, picked)
        for i, tok, val in zip(plain, picked.view(-1).tolist(), lp.view(-1).tolist()):
            tokens[i], logprobs[i] = tok, val
    for i in range(n):
        if i not in done:
            tokens[i], logprobs[i] = sample_token(
                logits[i], temperature=temperatures[i], top_p=top_ps[i], generator=generators[i]
            )
    return tokens, logprobs
