"""Expert parallelism: all-to-all token dispatch and combine (dropless MoE).

Local experts of EP rank r are the contiguous block `[r*E/ep, (r+1)*E/ep)`.
Per MoE layer and microbatch:
  1. route (softmax -> top-k -> renormalise) and sort the token slots by
     expert (`moe_dispatch_order`), so slots for EP rank j are contiguous;
  2. exchange the `[ep, E/ep]` count matrix (all_to_all_single, long);
  3. all-to-all the token rows with uneven splits (backward: the reverse a2a);
  4. regroup received rows by local expert, run each expert's SwiGLU;
  5. reverse all-to-all, scale by the routing weight, index_add into tokens.
ETP (expert tensor parallel) > 1 is not implemented; the spec check refuses it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness import ops, taps
from harness.model.grouped import grouped_swiglu, stack_experts, use_grouped
from harness.parallel import comm


def local_expert_range(num_experts: int, ep: int, ep_rank: int) -> range:
    n = num_experts // ep
    return range(ep_rank * n, (ep_rank + 1) * n)


def moe_forward(
    tokens: torch.Tensor,
    router_weight: torch.Tensor,
    experts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    num_experts: int,
    top_k: int,
    norm_topk_prob: bool,
    ep_group,
    ep: int,
    names: tuple[str, list[int]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens `[T, H]`; `experts` = this rank's local (gate, up, down) weights in
    expert order. Returns (output `[T, H]`, router logits `[T, E]`). ``names``: the
    block's module prefix and the local experts' global ids, for the numerics taps
    (``harness.taps``: the router ``<prefix>.gate``, each expert ``<prefix>.experts.<e>``)."""
    prefix, expert_ids = names if names is not None else ("mlp", list(range(len(experts))))

    def router(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = F.linear(t, router_weight)
        _, w, idx = ops.route(logits, top_k, norm_topk_prob)
        return logits, w, idx

    router_logits, weights, indices = taps.call(prefix + ".gate", router, tokens)
    order, counts = ops.moe_dispatch_order(indices, num_experts)
    token_of_slot = order // top_k
    slot_weight = weights.reshape(-1)[order]
    n_local = num_experts // ep

    send = tokens.index_select(0, token_of_slot)
    send_counts = counts.view(ep, n_local)
    recv_counts = comm.exchange_counts(send_counts, ep_group)  # row j: from rank j, per local expert
    in_splits = send_counts.sum(1).tolist()
    out_splits = recv_counts.sum(1).tolist()
    recv = comm.all_to_all(send, out_splits, in_splits, ep_group)

    # regroup rows (source-major, expert-minor) into expert-major order
    perm = _expert_major_permutation(recv_counts)
    grouped = recv.index_select(0, perm)
    if experts and use_grouped(grouped):  # cuda bf16: two grouped GEMMs (harness.model.grouped)
        y_grouped = grouped_swiglu(grouped, *stack_experts(experts), recv_counts.sum(0))
    else:
        per_expert = recv_counts.sum(0).tolist()
        outs = []
        start = 0
        for e, (gate_w, up_w, down_w), n in zip(expert_ids, experts, per_expert):
            chunk = grouped[start : start + n]
            outs.append(taps.call(f"{prefix}.experts.{e}", ops.swiglu, chunk, gate_w, up_w, down_w))
            start += n
        y_grouped = torch.cat(outs) if outs else grouped
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    y_recv = y_grouped.index_select(0, inverse)

    y_back = comm.all_to_all(y_recv, in_splits, out_splits, ep_group)
    out = torch.zeros_like(tokens).index_add(0, token_of_slot, y_back * slot_weight.unsqueeze(-1))
    return out, router_logits


def _expert_major_permutation(recv_counts: torch.Tensor) -> torch.Tensor:
    """Row order that turns source-major blocks into expert-major blocks
    (stable: within an expert, source rank order)."""
    ep, n_local = recv_counts.shape
    counts = recv_counts.tolist()
    offsets = []
    o = 0
    for j in range(ep):
        row = []
        for e in range(n_local):
            row.append(o)
            o += counts[j][e]
        offsets.append(row)
    idx = []
    for e in range(n_local):
        for j in range(ep):
            idx.extend(range(offsets[j][e], offsets[j][e] + counts[j][e]))
    return torch.tensor(idx, dtype=torch.long, device=recv_counts.device)
