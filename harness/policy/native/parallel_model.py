"""The Qwen3-MoE stage that one rank of a TP x PP x CP x DP (+EP) layout holds
(the native policy backend's model).

Built from the *full* reference weights (the state dict of
`harness.model.qwen3_moe.build_reference_model(cfg, seed)`) and sliced by the
rank's coordinates, so every layout starts from the same model. Parameter names
are the HF names of the full model; a parameter holds this rank's shard of it
(`shard_specs[name]` says how), so the policy engine's `hf_state_dict` can
reassemble full tensors by name:

    embed_tokens, lm_head         rows (vocab) over tp
    q/k/v_proj                    rows (heads) over tp
    o_proj                        columns over tp
    experts.{e}.*                 only local experts e (ep), full tensors
    norms, q/k norms, router      replicated

Data flow of one stage forward (b = microbatch, S = seq_len, s = S/cp):
    ids [b,S] -> zig-zag chunk [b,s] -> vocab-parallel embedding -> [b, s/tp, H]
    each layer: norm -> SP gather -> q/k/v (local heads) -> qk-norm, rope(abs pos)
      -> CP attention (K/V gathered) -> o_proj + reduce-scatter -> residual
      -> norm -> EP MoE on the [b*s/tp] local tokens -> residual
    last stage: norm -> SP gather -> lm_head shard -> vocab-parallel logprobs
      -> CP unchunk -> logprobs [b,S] (column 0 = 0), identical on tp/cp peers
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from harness import ops, taps
from harness.model.config import ModelConfig
from harness.parallel import context, expert, tensor
from harness.parallel.data import EXPERT, TP_REPLICATED, TP_SHARDED
from harness.parallel.groups import ProcessGroups
from harness.taps import BLOCK


@dataclass(frozen=True)
class ShardSpec:
    """How a local parameter relates to the full HF tensor."""

    kind: str  # TP_SHARDED | TP_REPLICATED | EXPERT (gradient reduction class)
    dim: int | None  # shard dim over tp, or None when the local tensor is full


def _shard_spec(name: str) -> ShardSpec:
    if ".mlp.experts." in name:
        return ShardSpec(EXPERT, None)
    if name.endswith(("embed_tokens.weight", "lm_head.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight")):
        return ShardSpec(TP_SHARDED, 0)
    if name.endswith("o_proj.weight"):
        return ShardSpec(TP_SHARDED, 1)
    return ShardSpec(TP_REPLICATED, None)


class ParallelQwen3Moe(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        groups: ProcessGroups,
        layers: range,
        full_state: dict[str, torch.Tensor],
        *,
        seq_len: int,
        is_first: bool,
        is_last: bool,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.groups = groups
        c = groups.coords
        sizes = groups.layout.sizes
        self.tp, self.cp, self.ep = sizes["tp"], sizes["cp"], sizes["ep"]
        self.tp_rank, self.cp_rank, self.ep_rank = c["tp"], c["cp"], c["ep"]
        self.seq_len = seq_len
        self.is_first, self.is_last = is_first, is_last
        self.layer_ids = list(layers)
        self.local_experts = list(expert.local_expert_range(cfg.experts, self.ep, self.ep_rank))
        self.vocab_start = self.tp_rank * (cfg.vocab // self.tp)
        # a buffer, so `.to(device)` moves it with the weights (non-persistent: not in state dicts)
        self.register_buffer("positions", context.zigzag_positions(seq_len, self.cp, self.cp_rank), persistent=False)

        self.shard_specs: dict[str, ShardSpec] = {}
        self._params = nn.ParameterDict()  # flat store; keys are HF names with '.' -> '|'
        for name, full in full_state.items():
            if not self._holds(name):
                continue
            spec = _shard_spec(name)
            local = full
            if spec.dim == 0:
                local = tensor.shard_rows(full, self.tp_rank, self.tp)
            elif spec.dim == 1:
                local = tensor.shard_cols(full, self.tp_rank, self.tp)
            self._params[name.replace(".", "|")] = nn.Parameter(local.detach().clone())
            self.shard_specs[name] = spec

    # -- parameter bookkeeping -------------------------------------------------

    def _holds(self, name: str) -> bool:
        if name.startswith("model.embed_tokens."):
            return self.is_first
        if name.startswith(("model.norm.", "lm_head.")):
            return self.is_last
        parts = name.split(".")
        if int(parts[2]) not in self.layer_ids:
            return False
        if ".mlp.experts." in name:
            return int(parts[5]) in self.local_experts
        return True

    def p(self, name: str) -> torch.Tensor:
        return self._params[name.replace(".", "|")]

    def hf_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(HF name, local shard) in a fixed order (the full model's order)."""
        return [(k.replace("|", "."), v) for k, v in self._params.items()]

    def param_kinds(self) -> dict[str, str]:
        return {n: s.kind for n, s in self.shard_specs.items()}

    # -- forward ---------------------------------------------------------------

    def activation_shape(self, micro_batch: int) -> tuple[int, int, int]:
        return (micro_batch, self.seq_len // (self.cp * self.tp), self.cfg.hidden)

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
        """First stage: from `input_ids [b, S]`; others: from `hidden`
        `[b, S/(cp*tp), H]`. Returns the next stage's input, or on the last
        stage the logprobs `[b, S]`."""
        cfg, g = self.cfg, self.groups
        if input_ids.shape[1] != self.seq_len:
            raise ValueError(
                f"input_ids has sequence length {input_ids.shape[1]}, expected policy.seq_len={self.seq_len}"
            )
        pos = self.positions
        probe = taps.active()
        if probe is not None:
            probe.begin_microbatch()
        if self.is_first:
            hidden = taps.call("model.embed_tokens", lambda ids: tensor.vocab_parallel_embedding(
                ids, self.p("model.embed_tokens.weight"), self.vocab_start, g["tp"]), input_ids[:, pos], level=BLOCK)
        cos, sin = taps.call("model.rotary_emb", ops.rope_cos_sin, pos, cfg.head_dim, cfg.rope_theta, hidden.dtype)
        for i in self.layer_ids:
            hidden = self._layer(i, hidden, cos, sin)
        if not self.is_last:
            return hidden
        h = taps.call("model.norm", lambda x: tensor.sp_gather(
            ops.rms_norm(x, self.p("model.norm.weight"), cfg.rms_eps), g["tp"]), hidden, level=BLOCK)
        logits = taps.call("lm_head", F.linear, h, self.p("lm_head.weight"), level=BLOCK)
        targets = input_ids[:, (pos + 1).clamp(max=self.seq_len - 1)]
        lp = tensor.vocab_parallel_logprobs(logits, targets, self.vocab_start, g["tp"])  # [b, s] at pos -> pos+1
        full = context.unchunk(lp, self.seq_len, g["cp"], self.cp)  # [b, S], entry t predicts t+1
        return F.pad(full[:, :-1], (1, 0), value=0.0)

    def _layer(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        pre = f"model.layers.{i}."
        x = x + taps.call(pre + "self_attn", self._attention, i, x, cos, sin, level=BLOCK)
        return x + taps.call(pre + "mlp", self._moe, i, x, level=BLOCK)

    def _attention(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The attention block's output (before the residual add); SP around it."""
        cfg, g = self.cfg, self.groups
        pre = f"model.layers.{i}."
        at = pre + "self_attn."
        b = x.shape[0]
        d = cfg.head_dim
        # column-parallel q/k/v, row-parallel o
        h = taps.call(pre + "input_layernorm", lambda t: tensor.sp_gather(
            ops.rms_norm(t, self.p(pre + "input_layernorm.weight"), cfg.rms_eps), g["tp"]), x)
        s = h.shape[1]
        q = taps.call(at + "q_proj", lambda t: F.linear(t, self.p(at + "q_proj.weight")).view(b, s, -1, d), h)
        k = taps.call(at + "k_proj", lambda t: F.linear(t, self.p(at + "k_proj.weight")).view(b, s, -1, d), h)
        v = taps.call(at + "v_proj", lambda t: F.linear(t, self.p(at + "v_proj.weight")).view(b, s, -1, d), h)
        if cfg.qk_norm:
            q = taps.call(at + "q_norm", ops.rms_norm, q, self.p(at + "q_norm.weight"), cfg.rms_eps)
            k = taps.call(at + "k_norm", ops.rms_norm, k, self.p(at + "k_norm.weight"), cfg.rms_eps)
        q, k = taps.call(at + "rotary", lambda a, c: (ops.apply_rope(a, cos, sin), ops.apply_rope(c, cos, sin)), q, k)
        attn = taps.call(at + "attention", lambda a, c, e: context.cp_attention(
            a, c, e, self.positions, self.seq_len, g["cp"], self.cp), q, k, v)
        return taps.call(at + "o_proj", lambda t: tensor.row_parallel_sp(
            t.reshape(b, s, -1), self.p(at + "o_proj.weight"), g["tp"]), attn)

    def _moe(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """The MoE block's output (before the residual add) on this rank's sequence-parallel tokens."""
        cfg, g = self.cfg, self.groups
        pre = f"model.layers.{i}."
        h = taps.call(pre + "post_attention_layernorm", ops.rms_norm, x,
                      self.p(pre + "post_attention_layernorm.weight"), cfg.rms_eps)
        experts = [
            tuple(self.p(f"{pre}mlp.experts.{e}.{w}_proj.weight") for w in ("gate", "up", "down"))
            for e in self.local_experts
        ]
        out, _ = expert.moe_forward(
            h.reshape(-1, cfg.hidden),
            self.p(pre + "mlp.gate.weight"),
            experts,
            num_experts=cfg.experts,
            top_k=cfg.top_k,
            norm_topk_prob=cfg.norm_topk_prob,
            ep_group=g["ep"],
            ep=self.ep,
            names=(pre + "mlp", self.local_experts),
        )
        return out.view_as(x)
