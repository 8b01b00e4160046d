"""Parameter counts of a Qwen3-MoE ``model`` block (closed form, no tensors).

Counts match transformers' ``Qwen3MoeForCausalLM`` (untied embeddings, no
biases, no shared expert, every layer MoE): the tiny CPU config gives
314,048 total / 166,592 active and Qwen3-235B-A22B gives 235,093,634,560 /
22,190,763,520. *Active* = everything except the
experts, plus ``top_k`` experts per layer.
"""

from __future__ import annotations

from typing import Any

from harness.spec.typed import as_mapping


def estimate_params(model: Any) -> dict[str, int]:
    """{"total": ..., "active": ..., "per_expert": ..., "embedding": ...} of the ``model``
    block (``harness.spec.typed.ModelSpec`` or a dict)."""
    model = as_mapping(model)
    h, hd = model["hidden"], model["head_dim"]
    heads, kv = model["heads"], model["kv_heads"]
    experts, inter = model["experts"], model["moe_intermediate"]
    attention = h * heads * hd * 2 + h * kv * hd * 2  # q, o + k, v
    qk_norm = 2 * hd if model.get("qk_norm", True) else 0
    norms = 2 * h  # input + post-attention RMSNorm
    router = experts * h
    per_expert = 3 * h * inter  # gate, up, down
    dense_per_layer = attention + qk_norm + norms + router
    embedding = model["vocab"] * h
    outside = 2 * embedding + h  # embed + untied lm_head + final norm
    layers = model["layers"]
    return {
        "total": outside + layers * (dense_per_layer + experts * per_expert),
        "active": outside + layers * (dense_per_layer + model["top_k"] * per_expert),
        "per_expert": per_expert,
        "embedding": embedding,
    }
