"""megatron-core GPTModel with the Qwen3-MoE layout, built from the harness
`ModelConfig`, loaded from (and exported to) Hugging Face parameter names.

Layout flags (docs/megatron.md, "Layout flags"): RMSNorm, per-head
q/k layernorm, GQA (`num_query_groups = kv_heads`, `kv_channels = head_dim`),
RoPE with `rotary_base = rope_theta`, SwiGLU (`gated_linear_unit` + silu), no
linear biases, untied embeddings, softmax top-k router with
`moe_router_pre_softmax = not norm_topk_prob` (False = top-k logits then
softmax over k = HF renormalisation), no shared expert, no aux loss, dropless
alltoall token dispatcher, local (non-TE) layer spec.

Name map, megatron (per rank) <-> HF (full):

    embedding.word_embeddings.weight            model.embed_tokens.weight      rows over tp
    decoder.layers.{l}.input_layernorm.weight   model.layers.{g}.input_layernorm.weight
    ...self_attention.linear_qkv.weight          q/k/v_proj, per KV group [q_g; k_g; v_g], groups over tp
    ...self_attention.{q,k}_layernorm.weight     self_attn.{q,k}_norm.weight
    ...self_attention.linear_proj.weight         self_attn.o_proj.weight        columns over tp
    ...pre_mlp_layernorm.weight                  post_attention_layernorm.weight
    ...mlp.router.weight                         mlp.gate.weight
    ...mlp.experts.local_experts.{j}.linear_fc1  experts.{ep*E/EP+j}.[gate_proj; up_proj]
    ...mlp.experts.local_experts.{j}.linear_fc2  experts.{..}.down_proj
    decoder.final_layernorm.weight               model.norm.weight
    output_layer.weight                          lm_head.weight                 rows over tp

`l` is the stage-local layer index, `g = stage offset + l`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from harness.model.config import ModelConfig
from harness.spec.typed import PolicySpec


def transformer_config(cfg: ModelConfig, policy: PolicySpec, device: str):
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = cfg.torch_dtype()
    tp = policy.tp
    kw: dict[str, Any] = {
        "num_layers": cfg.layers,
        "hidden_size": cfg.hidden,
        "num_attention_heads": cfg.heads,
        "num_query_groups": cfg.kv_heads,
        "kv_channels": cfg.head_dim,
        "ffn_hidden_size": cfg.moe_intermediate,
        "normalization": "RMSNorm",
        "layernorm_epsilon": cfg.rms_eps,
        "qk_layernorm": cfg.qk_norm,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "num_moe_experts": cfg.experts,
        "moe_router_topk": cfg.top_k,
        "moe_ffn_hidden_size": cfg.moe_intermediate,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not cfg.norm_topk_prob,
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_grouped_gemm": False,
        "moe_token_dispatcher_type": "alltoall",
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": policy.pp,
        "expert_model_parallel_size": policy.ep,
        "expert_tensor_parallel_size": policy.etp,
        "context_parallel_size": policy.cp,
        "sequence_parallel": tp > 1 and policy.sp,
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
        "bf16": dtype == torch.bfloat16,
        "fp16": dtype == torch.float16,
        "init_method_std": cfg.init_std,
        "use_cpu_initialization": device == "cpu",
        "perform_initialization": False,  # weights come from the reference model
        "gradient_accumulation_fusion": False,
        "bias_activation_fusion": False,
        "masked_softmax_fusion": False,
        "bias_dropout_fusion": False,
        "apply_rope_fusion": False,
        "persist_layer_norm": False,
        "deterministic_mode": True,
        # the harness loss is already normalised by the global counts: the
        # pipeline schedule must not divide it by tokens or microbatches
        "calculate_per_token_loss": True,
        # point-to-point pipeline transfers as individual isend/irecv pairs
        # (megatron's even/odd ordering); gloo has no coalesced p2p batches
        "batch_p2p_comm": False,
        "batch_p2p_sync": False,
    }
    layout = policy.pp_layout
    if policy.pp > 1 and layout is not None:
        # harness pp_layout = [first, last]; the middle stages split the rest evenly
        kw["num_layers_in_first_pipeline_stage"] = int(layout[0])
        kw["num_layers_in_last_pipeline_stage"] = int(layout[1])
    return TransformerConfig(**kw)


def build_gpt_model(cfg: ModelConfig, policy: PolicySpec, device: str, *, pre_process: bool, post_process: bool):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = transformer_config(cfg, policy, device)
    spec = get_gpt_layer_local_spec(
        num_experts=cfg.experts, moe_grouped_gemm=False, qk_layernorm=cfg.qk_norm, normalization="RMSNorm"
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=cfg.vocab,
        max_sequence_length=cfg.max_position,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=False,  # full-vocab logits on every tp rank
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        rotary_base=cfg.rope_theta,
    )
    if device == "cuda":
        model = model.cuda()
        from harness.policy.megatron.grouped_experts import install

        install(model)  # the local experts as two grouped GEMMs (the CPU keeps megatron's loop)
    return model


# -- name conversion ---------------------------------------------------------------

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")

_SIMPLE = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.router.weight": "mlp.gate.weight",
}


class NameMap:
    """Converts between one rank's megatron parameters and full HF tensors.

    `coords`: tp, ep (expert-parallel rank), layer_offset, experts_per_rank."""

    def __init__(self, cfg: ModelConfig, tp: int, tp_rank: int, ep: int, ep_rank: int, layer_offset: int) -> None:
        self.cfg, self.tp, self.tp_rank = cfg, tp, tp_rank
        self.ep, self.ep_rank, self.offset = ep, ep_rank, layer_offset
        self.local_experts = cfg.experts // ep

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        n = t.shape[0] // self.tp
        return t[self.tp_rank * n : (self.tp_rank + 1) * n]

    def _cols(self, t: torch.Tensor) -> torch.Tensor:
        n = t.shape[1] // self.tp
        return t[:, self.tp_rank * n : (self.tp_rank + 1) * n]

    def _qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        d, g = self.cfg.head_dim, self.cfg.kv_heads
        per = self.cfg.kv_groups * d
        groups = [
            torch.cat([q[i * per : (i + 1) * per], k[i * d : (i + 1) * d], v[i * d : (i + 1) * d]]) for i in range(g)
        ]
        n = g // self.tp
        return torch.cat(groups[self.tp_rank * n : (self.tp_rank + 1) * n])

    def hf_names(self, mname: str) -> list[str]:
        """HF names a megatron parameter is built from (for messages/ownership)."""
        return [n for n, _ in self._sources(mname)]

    def _sources(self, mname: str) -> list[tuple[str, Any]]:
        if mname == "embedding.word_embeddings.weight":
            return [("model.embed_tokens.weight", None)]
        if mname == "output_layer.weight":
            return [("lm_head.weight", None)]
        if mname == "decoder.final_layernorm.weight":
            return [("model.norm.weight", None)]
        m = _LAYER.match(mname)
        if not m:
            raise KeyError(f"megatron parameter {mname!r} has no HF counterpart")
        g, rest = int(m.group(1)) + self.offset, m.group(2)
        p = f"model.layers.{g}."
        if rest in _SIMPLE:
            return [(p + _SIMPLE[rest], None)]
        if rest == "self_attention.linear_qkv.weight":
            return [(p + f"self_attn.{x}_proj.weight", None) for x in "qkv"]
        if rest == "self_attention.linear_proj.weight":
            return [(p + "self_attn.o_proj.weight", None)]
        e = _EXPERT.match(rest)
        if e:
            idx = self.ep_rank * self.local_experts + int(e.group(1))
            q = f"{p}mlp.experts.{idx}."
            if e.group(2) == "linear_fc1":
                return [(q + "gate_proj.weight", None), (q + "up_proj.weight", None)]
            return [(q + "down_proj.weight", None)]
        raise KeyError(f"megatron parameter {mname!r} has no HF counterpart")

    def to_megatron(self, mname: str, full: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """This rank's value of megatron parameter `mname` from full HF tensors."""
        names = self.hf_names(mname)
        ts = [full[n] for n in names]
        if mname in ("embedding.word_embeddings.weight", "output_layer.weight"):
            return self._rows(ts[0])
        if mname.endswith("linear_qkv.weight"):
            return self._qkv(*ts)
        if mname.endswith("linear_proj.weight"):
            return self._cols(ts[0])
        if mname.endswith("linear_fc1.weight"):
            return torch.cat(ts)
        return ts[0]

    def to_hf(self, mname: str, shards: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full HF tensors from the tp shards (tp-rank order) of `mname`
        (a single-element list for tp-replicated parameters)."""
        names = self.hf_names(mname)
        cfg = self.cfg
        if mname in ("embedding.word_embeddings.weight", "output_layer.weight"):
            return {names[0]: torch.cat(shards, 0)}
        if mname.endswith("linear_proj.weight"):
            return {names[0]: torch.cat(shards, 1)}
        if mname.endswith("linear_qkv.weight"):
            d, per = cfg.head_dim, cfg.kv_groups * cfg.head_dim
            full = torch.cat(shards, 0).view(cfg.kv_heads, per + 2 * d, cfg.hidden)
            q = full[:, :per].reshape(-1, cfg.hidden)
            k = full[:, per : per + d].reshape(-1, cfg.hidden)
            v = full[:, per + d :].reshape(-1, cfg.hidden)
            return dict(zip(names, (q.contiguous(), k.contiguous(), v.contiguous())))
        if mname.endswith("linear_fc1.weight"):
            gate, up = shards[0].chunk(2, 0)
            return dict(zip(names, (gate.contiguous(), up.contiguous())))
        return {names[0]: shards[0]}


def is_tp_sharded(mname: str) -> bool:
    return mname in ("embedding.word_embeddings.weight", "output_layer.weight") or mname.endswith(
        ("linear_qkv.weight", "linear_proj.weight")
    )


def is_expert(mname: str) -> bool:
    return ".mlp.experts." in mname
