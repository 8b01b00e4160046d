"""Stateless Qwen3-MoE building blocks, shared by the reference model
(``harness.model``), the parallel layers (``harness.parallel``), the policy
engines and the native rollout engine. A leaf: it imports torch only, so every
layer above can use it without an import circle.

Layout conventions (all functions):
- activations are `[..., S, hidden]`; attention heads are `[B, S, heads, head_dim]`
  (sequence before heads, HF's layout before its transpose);
- RoPE tables are `[..., S, head_dim]` and indexed by *absolute* position, so a
  context-parallel chunk or a decode step uses the same values as the full
  sequence;
- reductions that must match HF bit-for-bit in spirit (RMSNorm, router softmax,
  log-softmax) run in fp32 and cast back to the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * (x / sqrt(mean(x^2) + eps))` over the last dim.

    The statistic is computed in fp32 and the result cast back to `x.dtype`
    *before* the weight multiply (HF Qwen3 order; no "+1" offset)."""
    input_dtype = x.dtype
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    x32 = x32 * torch.rsqrt(variance + eps)
    return weight * x32.to(input_dtype)


# ---------------------------------------------------------------------------
# Rotary position embedding (non-interleaved, rotate_half form)
# ---------------------------------------------------------------------------


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """`1 / theta^(2i/d)` for i in [0, d/2), fp32, shape `[head_dim // 2]`."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exponent)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for absolute `positions` (any shape `[...]` of ints).

    Returns two tensors of shape `[..., head_dim]` in `dtype`; the two halves
    of the last dim repeat the same frequencies (`cat(freqs, freqs)`)."""
    inv_freq = rope_inv_freq(head_dim, theta).to(positions.device)
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # [..., d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """`[x1, x2] -> [-x2, x1]` over the halves of the last dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x [B, S, H, D]` by tables `cos/sin [B, S, D]` or `[S, D]`
    (broadcast over heads)."""
    cos = cos.unsqueeze(-2)
    sin = sin.unsqueeze(-2)
    return (x * cos) + (rotate_half(x) * sin)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
) -> torch.Tensor:
    """Causal softmax attention with GQA, masking by absolute position.

    q: `[B, Sq, Hq, D]`; k, v: `[B, Sk, Hkv, D]` with `Hq % Hkv == 0`;
    q_positions `[Sq]`, k_positions `[Sk]` (ints). Key j is visible to query i
    iff `k_positions[j] <= q_positions[i]`, so chunked (context-parallel) and
    incremental (KV-cache) callers get exactly the full-sequence result.
    Every query must see at least one key. Returns `[B, Sq, Hq, D]`.
    Computed eagerly (explicit softmax in fp32, cast back to the input dtype) with scale `D**-0.5`."""
    _b, _sq, hq, d = q.shape
    hkv = k.shape[2]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
    groups = hq // hkv
    qh = q.transpose(1, 2)  # [B, Hq, Sq, D]
    kh = k.transpose(1, 2).repeat_interleave(groups, dim=1)  # [B, Hq, Sk, D]
    vh = v.transpose(1, 2).repeat_interleave(groups, dim=1)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * (d**-0.5)
    visible = k_positions.view(1, -1) <= q_positions.view(-1, 1)  # [Sq, Sk]
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores.to(torch.float32), dim=-1).to(q.dtype)
    out = torch.matmul(probs, vh)  # [B, Hq, Sq, D]
    return out.transpose(1, 2)


# ---------------------------------------------------------------------------
# Router and experts
# ---------------------------------------------------------------------------


def route(
    router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax over all experts (fp32) -> top-k -> optional renormalisation.

    router_logits: `[T, E]`. Returns `(probs [T, E] fp32, weights [T, k] in the
    logits dtype, indices [T, k] long)`. With `norm_topk_prob` the k weights of
    a token sum to 1 (equal to Megatron's softmax-after-top-k)."""
    probs = torch.softmax(router_logits.to(torch.float32), dim=-1)
    weights, indices = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return probs, weights.to(router_logits.dtype), indices


def swiglu(
    x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor
) -> torch.Tensor:
    """One SwiGLU MLP with no bias: `down(silu(gate(x)) * up(x))`.

    Weights use the nn.Linear layout: gate/up `[I, H]`, down `[H, I]`."""
    return F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)


def moe_dispatch_order(indices: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Group the `T*k` (token, slot) pairs by expert, stable within an expert.

    Returns `(order [T*k], counts [E])`: `order` indexes the flattened
    `indices` so that slots for expert 0 come first (in token order), then
    expert 1, ...; `counts[e]` is the number of slots routed to e. Used by the
    single-process MoE and by the expert-parallel dispatcher, so both visit
    each expert's tokens in the same order."""
    flat = indices.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return order, counts


def one_hot(index: torch.Tensor, classes: int) -> torch.Tensor:
    """``F.one_hot(index, classes)`` (int64, bit for bit), built on the CPU from ``zeros`` and
    ``scatter_`` (which refuses an index out of range, as ``one_hot`` does). ``F.one_hot``'s own
    operator stream differs between torch releases (2.13 checks the bounds with ``aminmax``, 2.11
    with ``min`` and ``max``), and one CPU golden is held on machines with either build (the
    operators surface counts every ATen call); other devices keep ``F.one_hot`` (a cuda golden
    is captured and checked on one torch build)."""
    if index.device.type != "cpu":
        return F.one_hot(index, classes)
    out = torch.zeros((*index.shape, classes), dtype=torch.int64)
    return out.scatter_(-1, index.unsqueeze(-1), 1)


def aux_loss_statistics(
    router_logits: torch.Tensor, top_k: int, row_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-expert sufficient statistics of HF's pooled load-balancing loss for
    one layer's router logits `[T, E]`.

    Returns `(slot_counts [E], prob_sums [E], rows)` in fp32: how many top-k
    slots chose each expert, the summed full-softmax probability per expert and
    the number of (unmasked) rows. Sum them over layers and ranks, then call
    `aux_loss_from_statistics`. The top-k is recomputed from the logits (no
    renormalisation enters), as HF does."""
    probs = torch.softmax(router_logits.to(torch.float32), dim=-1)
    _, idx = torch.topk(probs, top_k, dim=-1)
    slots = one_hot(idx, probs.shape[-1]).to(torch.float32).sum(dim=1)  # [T, E]
    if row_mask is not None:
        m = row_mask.reshape(-1, 1).to(torch.float32)
        slots = slots * m
        probs = probs * m
        rows = m.sum()
    else:
        rows = torch.tensor(float(probs.shape[0]))
    return slots.sum(0), probs.sum(0), rows


def aux_loss_from_statistics(
    slot_counts: torch.Tensor, prob_sums: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """`E * sum_e f_e * P_e` with `f_e = counts_e / rows`, `P_e = prob_sums_e / rows`.

    Balanced routing gives `top_k` (not 1): f is not divided by k (HF's form)."""
    num_experts = slot_counts.shape[-1]
    return num_experts * torch.sum((slot_counts / rows) * (prob_sums / rows))


# ---------------------------------------------------------------------------
# Log-probabilities
# ---------------------------------------------------------------------------


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """`out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`, column 0 is 0.

    logits `[B, S, V]` (position t predicts token t+1), input_ids `[B, S]`.
    Log-softmax in fp32; returns fp32 `[B, S]`."""
    logp = torch.log_softmax(logits[:, :-1].to(torch.float32), dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return F.pad(picked, (1, 0), value=0.0)


def init_normal_(t: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """Fill `t` in place from N(0, std) with an explicit generator (no global RNG)."""
    with torch.no_grad():
        t.normal_(0.0, std, generator=generator)
    return t


__all__ = [
    "rms_norm",
    "rope_inv_freq",
    "rope_cos_sin",
    "rotate_half",
    "apply_rope",
    "causal_attention",
    "route",
    "swiglu",
    "moe_dispatch_order",
    "aux_loss_statistics",
    "aux_loss_from_statistics",
    "token_logprobs",
    "init_normal_",
]
