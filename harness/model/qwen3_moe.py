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
drawn in the per-expert layout's `named_parameters()` order from one CPU
generator, so every rank of every layout can rebuild the same full weights and
shard them.

Expert layouts (``expert_layout``; the names above are the checkpoint's in both):

* ``"per_expert"`` (the default): one `Expert` module per expert, so
  `named_parameters()` are the checkpoint names too. Every backend that shards,
  optimises or refits the reference model's parameters by name (dtensor,
  LoRA, the CPU goldens) uses this layout.
* ``"stacked"``: each layer's experts are one `ExpertStack`, two parameters
  ``mlp.experts.gate_up_proj [E, 2I, H]`` (expert e's gate rows, then its up
  rows) and ``mlp.experts.down_proj [E, H, I]``: the grouped GEMMs' operands
  without a copy per forward, and two gradients per layer instead of 3E.
  `named_parameters()` are the stacked ones; `state_dict()` and
  `load_state_dict()` speak the per-expert names and shapes above (state-dict
  hooks: values are views into the stacks, in the per-expert layout's key
  order), and `init_weights(seed)` draws the same values, so both layouts hold
  the same weights for a seed, bit for bit, and load each other's state dicts.
"""

from __future__ import annotations

import torch
from torch import nn

from harness import ops
from harness.model.config import ModelConfig
from harness.model.grouped import grouped_swiglu, stack_experts, use_grouped

EXPERT_LAYOUTS = ("per_expert", "stacked")


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


EXPERT_WEIGHTS = ("gate_proj", "up_proj", "down_proj")


class ExpertStack(nn.Module):
    """One layer's experts as two stacked parameters (``expert_layout="stacked"``):
    ``gate_up_proj [E, 2I, H]`` (expert e's ``gate_proj.weight`` rows, then its
    ``up_proj.weight`` rows) and ``down_proj [E, H, I]`` (transformers v5's fused
    layout). ``operands()`` are the grouped GEMMs' right operands as views (the same
    values and strides as `stack_experts` of the per-expert weights, so the grouped
    forward rounds identically and gradients land in the two stacks).

    Contract with the outside: `state_dict()` holds ``{e}.{gate,up,down}_proj.weight``
    (per-expert shapes ``[I, H]``, ``[I, H]``, ``[H, I]``; views into the stacks), in
    expert order, gate/up/down per expert, as the per-expert layout's ``ModuleList`` of
    `Expert`; `load_state_dict()` takes those keys (all of them, or the two stacked keys
    instead). Without ``init_weights`` the stacks are zeros."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_experts, self.inter = cfg.experts, cfg.moe_intermediate
        self.gate_up_proj = nn.Parameter(torch.zeros(cfg.experts, 2 * cfg.moe_intermediate, cfg.hidden))
        self.down_proj = nn.Parameter(torch.zeros(cfg.experts, cfg.hidden, cfg.moe_intermediate))
        self.register_state_dict_post_hook(_per_expert_state_dict)
        self.register_load_state_dict_pre_hook(_stacked_from_per_expert)

    def expert_weights(self, e: int, gate_up: torch.Tensor | None = None, down: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Expert ``e``'s ``(gate [I, H], up [I, H], down [H, I])`` as views of the stacks
        (or of ``gate_up``/``down`` given in the stacks' shapes)."""
        gate_up = self.gate_up_proj if gate_up is None else gate_up
        down = self.down_proj if down is None else down
        return gate_up[e, : self.inter], gate_up[e, self.inter :], down[e]

    def per_expert_names(self, prefix: str = "") -> list[str]:
        """The checkpoint names this stack stands for, in the per-expert layout's order."""
        return [f"{prefix}{e}.{w}.weight" for e in range(self.num_experts) for w in EXPERT_WEIGHTS]

    def per_expert_tensors(self, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
        """``(checkpoint name, view)`` for every expert weight, in ``per_expert_names`` order."""
        views = [t for e in range(self.num_experts) for t in self.expert_weights(e)]
        return list(zip(self.per_expert_names(prefix), views))

    def operands(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gate_up [E, H, 2I], down [E, I, H])``, transposed views: `grouped_swiglu`'s operands."""
        return self.gate_up_proj.transpose(1, 2), self.down_proj.transpose(1, 2)

    def forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e``'s SwiGLU of ``x`` (the per-expert loop's step)."""
        return ops.swiglu(x, *self.expert_weights(e))


def _per_expert_state_dict(module: ExpertStack, state_dict: dict, prefix: str, _meta: object) -> None:
    """State-dict post hook: the two stacked entries -> the per-expert entries (views), in order."""
    gate_up = state_dict.pop(prefix + "gate_up_proj")
    down = state_dict.pop(prefix + "down_proj")
    views = [t for e in range(module.num_experts) for t in module.expert_weights(e, gate_up, down)]
    state_dict.update(zip(module.per_expert_names(prefix), views))


def _stacked_from_per_expert(module: ExpertStack, state_dict: dict, prefix: str, _meta: object, _strict: bool,
                             _missing: list, _unexpected: list, error_msgs: list) -> None:
    """Load-state-dict pre hook: per-expert entries -> the two stacked entries. A state dict
    with the stacked keys, or with none of the expert keys, is left to the ordinary checks."""
    names = module.per_expert_names(prefix)
    if prefix + "gate_up_proj" in state_dict or not any(n in state_dict for n in names):
        return
    absent = [n for n in names if n not in state_dict]
    if absent:
        error_msgs.append(f"expert weights missing for the stacked layout: {', '.join(absent[:3])}"
                          f"{' ...' if len(absent) > 3 else ''} ({len(absent)} of {len(names)})")
        return
    t = [state_dict.pop(n) for n in names]
    state_dict[prefix + "gate_up_proj"] = torch.stack([torch.cat((t[i], t[i + 1])) for i in range(0, len(t), 3)])
    state_dict[prefix + "down_proj"] = torch.stack(t[2::3])


class SparseMoE(nn.Module):
    """Dropless top-k MoE: router `gate` + `experts`; no shared expert. ``experts`` is a
    ``ModuleList`` of `Expert` (``expert_layout="per_expert"``) or one `ExpertStack`
    (``"stacked"``); both hold the same checkpoint names."""

    def __init__(self, cfg: ModelConfig, expert_layout: str = "per_expert") -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        if expert_layout == "stacked":
            self.experts: nn.Module = ExpertStack(cfg)
        else:
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
        stacked = isinstance(self.experts, ExpertStack)
        if use_grouped(tokens):  # cuda (bf16, fp32): two grouped GEMMs instead of the per-expert loop
            if stacked:
                gate_up, down = self.experts.operands()
            else:
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
                x = tokens[idx]
                y = (self.experts(e, x) if stacked else self.experts[e](x)) * slot_weight[start : start + n, None]
                out = out.index_add(0, idx, y)
            start += n
        return out.view(shape), router_logits


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, expert_layout: str = "per_expert") -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mlp = SparseMoE(cfg, expert_layout)

    def forward(self, x, cos, sin, positions):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions)
        moe_out, router_logits = self.mlp(self.post_attention_layernorm(x))
        return x + moe_out, router_logits


class Qwen3MoeBody(nn.Module):
    """HF's `model.` prefix: embeddings, decoder layers, final norm."""

    def __init__(self, cfg: ModelConfig, expert_layout: str = "per_expert") -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg, expert_layout) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)


class Qwen3MoeForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, seed: int | None = None, expert_layout: str = "per_expert") -> None:
        super().__init__()
        if expert_layout not in EXPERT_LAYOUTS:
            raise ValueError(f"expert_layout must be one of {EXPERT_LAYOUTS}, got {expert_layout!r}")
        self.cfg = cfg
        self.expert_layout = expert_layout
        self.model = Qwen3MoeBody(cfg, expert_layout)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.to(cfg.torch_dtype())
        if seed is not None:
            self.init_weights(seed)

    def checkpoint_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """``(checkpoint name, tensor)`` in the per-expert layout's ``named_parameters()``
        order, whatever the layout: the parameters themselves, or for an `ExpertStack` its
        per-expert views (writable under ``no_grad``). The order ``init_weights`` draws in."""
        stacks = {name: m for name, m in self.named_modules() if isinstance(m, ExpertStack)}
        out: list[tuple[str, torch.Tensor]] = []
        for name, p in self.named_parameters():
            owner, _, leaf = name.rpartition(".")
            if owner in stacks:
                if leaf == "gate_up_proj":
                    out.extend(stacks[owner].per_expert_tensors(owner + "."))
                continue
            out.append((name, p))
        return out

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Norm weights = 1; every other weight ~ N(0, init_std), drawn in
        `checkpoint_parameters()` order (the per-expert layout's `named_parameters()`) from
        `torch.Generator().manual_seed(seed)`: both expert layouts get the same values."""
        gen = torch.Generator().manual_seed(int(seed))
        for name, p in self.checkpoint_parameters():
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


def build_reference_model(cfg: ModelConfig, seed: int, expert_layout: str = "per_expert") -> Qwen3MoeForCausalLM:
    """The full model with the deterministic weights for `seed`, in ``expert_layout``
    (``"stacked"``: the grouped GEMMs' layout, for a model that trains on cuda by itself;
    the same `state_dict()` either way, bit for bit)."""
    return Qwen3MoeForCausalLM(cfg, seed=seed, expert_layout=expert_layout)


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
