"""Reference Qwen3-MoE, single process, read top to bottom (nanoGPT style).

Parameter names are Hugging Face's checkpoint names, so `state_dict()` is a
Qwen3-MoE checkpoint:

    model.embed_tokens.weight                              [V, H]
    model.layers.{i}.input_layernorm.weight                [H]
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight       q [heads*D, H], k/v [kv*D, H], o [H, heads*D]
    model.layers.{i}.self_attn.{q,k}_norm.weight           [D]  (per-head QK RMSNorm)
    model.layers.{i}.post_attention_layernorm.weight       [H]
    model.layers.{i}.mlp.gate.weight                       [E, H]  (router)
    model.layers.{i}.mlp.experts.{e}.{gate,up}_proj.weight [I, H]
    model.layers.{i}.mlp.experts.{e}.down_proj.weight      [H, I]
    model.norm.weight                                      [H]
    lm_head.weight                                         [V, H]  (untied)

`init_weights(seed)` is a pure function of (config, seed): parameters are
drawn in `named_parameters()` order from one CPU generator, so every rank of
every layout can rebuild the same full weights and shard them.
"""

from __future__ import annotations

import torch
from torch import nn

from harness import ops
from harness.model.config import ModelConfig
from harness.model.grouped import grouped_swiglu, stack_experts, use_grouped


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """GQA attention with per-head QK RMSNorm applied before RoPE."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.hidden, cfg.q_width, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_width, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_width, bias=False)
        self.o_proj = nn.Linear(cfg.q_width, cfg.hidden, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.cfg.head_dim
        q = self.q_proj(x).view(b, s, -1, d)
        k = self.k_proj(x).view(b, s, -1, d)
        v = self.v_proj(x).view(b, s, -1, d)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        out = ops.causal_attention(q, k, v, positions, positions)
        return self.o_proj(out.reshape(b, s, -1))


class Expert(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.moe_intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.moe_intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.moe_intermediate, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.swiglu(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)


class SparseMoE(nn.Module):
    """Dropless top-k MoE: router `gate` + `experts`; no shared expert."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.experts = nn.ModuleList(Expert(cfg) for _ in range(cfg.experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (output like x, router logits [T, E])."""
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        router_logits = self.gate(tokens)
        _, weights, indices = ops.route(router_logits, self.cfg.top_k, self.cfg.norm_topk_prob)
        order, counts = ops.moe_dispatch_order(indices, self.cfg.experts)
        token_of_slot = order // self.cfg.top_k
        slot_weight = weights.reshape(-1)[order]
        if use_grouped(tokens):  # cuda (bf16, fp32): two grouped GEMMs instead of the per-expert loop
            gate_up, down = stack_experts(
                [(e.gate_proj.weight, e.up_proj.weight, e.down_proj.weight) for e in self.experts])
            y = grouped_swiglu(tokens.index_select(0, token_of_slot), gate_up, down, counts)
            out = torch.zeros_like(tokens).index_add(0, token_of_slot, y * slot_weight[:, None])
            return out.view(shape), router_logits
        out = torch.zeros_like(tokens)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                idx = token_of_slot[start : start + n]
                y = self.experts[e](tokens[idx]) * slot_weight[start : start + n, None]
                out = out.index_add(0, idx, y)
            start += n
        return out.view(shape), router_logits


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mlp = SparseMoE(cfg)

    def forward(self, x, cos, sin, positions):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions)
        moe_out, router_logits = self.mlp(self.post_attention_layernorm(x))
        return x + moe_out, router_logits


class Qwen3MoeBody(nn.Module):
    """HF's `model.` prefix: embeddings, decoder layers, final norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)


class Qwen3MoeForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Qwen3MoeBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.to(cfg.torch_dtype())
        if seed is not None:
            self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Norm weights = 1; every other weight ~ N(0, init_std), drawn in
        `named_parameters()` order from `torch.Generator().manual_seed(seed)`."""
        gen = torch.Generator().manual_seed(int(seed))
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(self.cfg.init_std))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """input_ids `[B, S]` -> (logits `[B, S, V]`, per-layer router logits `[B*S, E]`).

        No padding mask: sequences are right-padded and attention is causal, so
        pads never influence earlier tokens."""
        s = input_ids.shape[1]
        if positions is None:
            positions = torch.arange(s, device=input_ids.device)
        cos, sin = ops.rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, self.lm_head.weight.dtype)
        x = self.model.embed_tokens(input_ids)
        router_logits = []
        for layer in self.model.layers:
            x, rl = layer(x, cos, sin, positions)
            router_logits.append(rl)
        logits = self.lm_head(self.model.norm(x))
        return logits, router_logits

    def logprobs(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Per-token logprobs `[B, S]` aligned with input_ids (column 0 is 0)."""
        logits, _ = self.forward(input_ids)
        return ops.token_logprobs(logits, input_ids)

    def aux_loss(self, router_logits: list[torch.Tensor]) -> torch.Tensor:
        """HF's pooled load-balancing statistic over all layers (minimum = top_k)."""
        stats = [ops.aux_loss_statistics(rl, self.cfg.top_k) for rl in router_logits]
        counts = sum(s[0] for s in stats)
        probs = sum(s[1] for s in stats)
        rows = sum(s[2] for s in stats)
        return ops.aux_loss_from_statistics(counts, probs, rows)


def build_reference_model(cfg: ModelConfig, seed: int) -> Qwen3MoeForCausalLM:
    """The full model with the deterministic weights for `seed`."""
    return Qwen3MoeForCausalLM(cfg, seed=seed)


def reference_state_dict(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """``build_reference_model(cfg, seed).state_dict()`` bit for bit, on the CPU, without
    building the modules: the names, shapes and dtypes come from a model on the meta
    device, the values from the same draws in the same order as
    :meth:`Qwen3MoeForCausalLM.init_weights` (a change to one is a change to both: norm
    weights 1, every other weight ``randn(shape, generator) * init_std`` rounded to the
    model dtype). It skips the
    modules' default init, which ``init_weights`` overwrites anyway (seconds of serial
    ``uniform_`` draws for the medium model); unlike the full build it leaves the global
    CPU generator where it was (the megatron engine, its caller, draws nothing from it
    afterwards)."""
    with torch.device("meta"):
        meta = Qwen3MoeForCausalLM(cfg)
    if [n for n, _ in meta.named_parameters()] != list(meta.state_dict()):
        raise RuntimeError("reference_state_dict: the reference model holds buffers besides its parameters")
    gen = torch.Generator().manual_seed(int(seed))
    out: dict[str, torch.Tensor] = {}
    for name, p in meta.named_parameters():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(p.shape, dtype=p.dtype)
        else:
            out[name] = torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(cfg.init_std).to(p.dtype)
    return out


def hf_fused_state_dict(state_dict: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Per-expert checkpoint names -> transformers v5 fused expert layout:
    `mlp.experts.gate_up_proj [E, 2I, H]` (gate rows then up) and
    `mlp.experts.down_proj [E, H, I]`. Other keys pass through."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        if ".mlp.experts." not in name:
            out[name] = t
    for i in range(cfg.layers):
        p = f"model.layers.{i}.mlp.experts"
        gate = [state_dict[f"{p}.{e}.gate_proj.weight"] for e in range(cfg.experts)]
        up = [state_dict[f"{p}.{e}.up_proj.weight"] for e in range(cfg.experts)]
        down = [state_dict[f"{p}.{e}.down_proj.weight"] for e in range(cfg.experts)]
        out[f"{p}.gate_up_proj"] = torch.stack([torch.cat([g, u], 0) for g, u in zip(gate, up)])
        out[f"{p}.down_proj"] = torch.stack(down)
    return out
