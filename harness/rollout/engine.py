"""The native generation engine: KV cache, continuous batching, seeded sampling, TP.

An ``Engine`` is the inference twin of the reference Qwen3-MoE (as vLLM is to
Megatron): a separate implementation over a dict of HF-named tensors that
reuses ``harness.model.functional`` so both stacks compute the same math.

Batch invariance (a request's tokens and logprobs never depend on what else
is in the batch, on ``max_batch_size`` or on its KV slot) holds by
construction: every request's compute runs with its own shapes (prefill
``[1, P]``, decode ``[1, 1]``), because CPU BLAS picks different kernels for
different row counts (M = 1 takes a GEMV path). The batch is the unit of
scheduling and of communication: with TP > 1 one collective per layer and
sub-layer carries every request's rows of the step. That collective is an
``all_gather`` followed by a sum in rank order (not an ``all_reduce``, whose
ring chunking makes an element's summation order depend on the tensor size),
so the reduced rows are bitwise identical on every TP rank and for every
batch composition. Every TP rank therefore samples the same tokens.

Scheduling (``generate``): requests are admitted in order while slots are
free; each step prefills the newly admitted requests and decodes one token
for the running ones; finished requests free their slot at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.model import functional as Fn
from harness.model.config import ModelConfig
from harness.rollout.kv_cache import KVCachePool
from harness.rollout.requests import make_result, validate_request
from harness.rollout.sampling import sample_token
from harness.rollout.sharding import ShardPlan, hf_weight_shapes


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    """``all_gather`` into a flat ``[tp * N, ...]`` output (``all_gather_single`` when available)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp, group=group)


def as_model_config(model_cfg: ModelConfig | Mapping[str, Any]) -> ModelConfig:
    """Accept a ``ModelConfig``, a spec ``model`` block or a whole spec dict."""
    if isinstance(model_cfg, ModelConfig):
        return model_cfg
    return ModelConfig.from_spec(model_cfg)


@dataclass
class _Sequence:
    """One running request: its slot, generator and what it produced so far."""

    request: Mapping[str, Any]
    slot: int
    generator: torch.Generator
    max_new: int
    tokens: list[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cached: int = 0  # positions already in the KV cache
    finish_reason: str | None = None


class Engine:
    """Generation over HF-named weights with optional tensor parallelism.

    ``weights`` are *full* tensors (the engine keeps its TP shard); ``None``
    allocates zeros, to be filled by ``load_weights`` (a refit). With
    ``tp_size > 1`` every TP rank constructs an engine with its ``tp_rank``
    and the same ``tp_group`` and calls every method collectively.
    """

    def __init__(
        self,
        model_cfg: ModelConfig | Mapping[str, Any],
        weights: Mapping[str, torch.Tensor] | None,
        *,
        tp_rank: int = 0,
        tp_size: int = 1,
        tp_group: Any = None,
        max_batch_size: int = 8,
        device: str | torch.device = "cpu",
        eos_token_id: int | None = None,
    ) -> None:
        self.cfg = as_model_config(model_cfg)
        if max_batch_size < 1:
            raise ValueError(f"rollout.max_batch_size must be >= 1, got {max_batch_size}")
        if tp_size > 1 and tp_group is None:
            raise ValueError("an engine with tp_size > 1 needs its tp_group")
        self.plan = ShardPlan(self.cfg, tp_rank, tp_size)
        self.tp_group = tp_group
        self.device = torch.device(device)
        self.dtype = self.cfg.torch_dtype()
        self.max_batch_size = max_batch_size
        self.eos_token_id = eos_token_id
        self.weight_version = 0
        self._full_shapes = hf_weight_shapes(self.cfg)
        self.params: dict[str, torch.Tensor] = {
            name: torch.zeros(self.plan.local_shape(name, shape), dtype=self.dtype, device=self.device)
            for name, shape in self._full_shapes.items()
        }
        self.kv = KVCachePool(
            layers=self.cfg.layers,
            slots=max_batch_size,
            max_position=self.cfg.max_position,
            kv_heads=self.plan.local_kv_heads,
            head_dim=self.cfg.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        if weights is not None:
            missing = [n for n in self._full_shapes if n not in weights]
            if missing:
                raise ValueError(f"engine weights are missing {len(missing)} tensor(s), first: {missing[:3]}")
            self.load_weights(weights.items())

    # -- weights ---------------------------------------------------------------

    def state_dict_info(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Full (unsharded) ``(shape, dtype)`` per HF name: what a refit must send."""
        return {name: (shape, self.dtype) for name, shape in self._full_shapes.items()}

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """Copy full tensors into this rank's shards; return the names loaded.

        Unknown names, wrong shapes or dtypes raise ValueError naming the tensor.
        The copy is exact (same dtype), so refit preserves bits.
        """
        loaded = []
        for name, full in named_tensors:
            if name not in self._full_shapes:
                raise ValueError(f"engine has no parameter named {name!r}")
            if tuple(full.shape) != self._full_shapes[name]:
                raise ValueError(f"{name}: shape {tuple(full.shape)}, engine expects {self._full_shapes[name]}")
            if full.dtype != self.dtype:
                raise ValueError(f"{name}: dtype {full.dtype}, engine expects {self.dtype}")
            with torch.no_grad():
                self.params[name].copy_(self.plan.shard(name, full))
            loaded.append(name)
        return loaded

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's shards under HF names (``ShardPlan.unshard`` rebuilds full tensors)."""
        return {name: t.detach().clone() for name, t in self.params.items()}

    # -- collectives -------------------------------------------------------------

    def _tp_sum(self, partials: list[torch.Tensor]) -> list[torch.Tensor]:
        """Sum each row block over TP ranks, in rank order, identically on every rank."""
        if self.plan.tp_size == 1:
            return partials
        sizes = [p.shape[0] for p in partials]
        stacked = torch.cat(partials, dim=0).contiguous()
        flat = torch.empty((self.plan.tp_size * stacked.shape[0], *stacked.shape[1:]), dtype=stacked.dtype, device=stacked.device)
        _all_gather_flat(flat, stacked, self.tp_group)
        gathered = flat.view(self.plan.tp_size, *stacked.shape)
        total = gathered[0].clone()
        for r in range(1, self.plan.tp_size):
            total += gathered[r]
        return list(torch.split(total, sizes, dim=0))

    # -- model ---------------------------------------------------------------------

    def _attention_partial(self, layer: int, x: torch.Tensor, slot: int, start: int) -> torch.Tensor:
        """This rank's o_proj partial for one request's new rows ``x [T, H]``."""
        cfg, p = self.cfg, f"model.layers.{layer}.self_attn"
        t, d = x.shape[0], cfg.head_dim
        h = Fn.rms_norm(x, self.params[f"model.layers.{layer}.input_layernorm.weight"], cfg.rms_eps)
        q = F.linear(h, self.params[f"{p}.q_proj.weight"]).view(1, t, -1, d)
        k = F.linear(h, self.params[f"{p}.k_proj.weight"]).view(1, t, -1, d)
        v = F.linear(h, self.params[f"{p}.v_proj.weight"]).view(1, t, -1, d)
        if cfg.qk_norm:
            q = Fn.rms_norm(q, self.params[f"{p}.q_norm.weight"], cfg.rms_eps)
            k = Fn.rms_norm(k, self.params[f"{p}.k_norm.weight"], cfg.rms_eps)
        positions = torch.arange(start, start + t, device=self.device)
        cos, sin = Fn.rope_cos_sin(positions, d, cfg.rope_theta, self.dtype)
        q, k = Fn.apply_rope(q, cos, sin), Fn.apply_rope(k, cos, sin)
        self.kv.write(layer, slot, start, k[0], v[0])
        k_all, v_all = self.kv.read(layer, slot, start + t)
        out = Fn.causal_attention(q, k_all, v_all, positions, torch.arange(start + t, device=self.device))
        return F.linear(out.reshape(t, -1), self.params[f"{p}.o_proj.weight"])

    def _moe_partial(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """This rank's expert-column partial for one request's rows ``x [T, H]``."""
        cfg, p = self.cfg, f"model.layers.{layer}.mlp"
        h = Fn.rms_norm(x, self.params[f"model.layers.{layer}.post_attention_layernorm.weight"], cfg.rms_eps)
        router_logits = F.linear(h, self.params[f"{p}.gate.weight"])
        _, weights, indices = Fn.route(router_logits, cfg.top_k, cfg.norm_topk_prob)
        order, counts = Fn.moe_dispatch_order(indices, cfg.experts)
        token_of_slot = order // cfg.top_k
        slot_weight = weights.reshape(-1)[order]
        out = torch.zeros_like(h)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                idx = token_of_slot[start : start + n]
                e_p = f"{p}.experts.{e}"
                y = Fn.swiglu(
                    h[idx],
                    self.params[f"{e_p}.gate_proj.weight"],
                    self.params[f"{e_p}.up_proj.weight"],
                    self.params[f"{e_p}.down_proj.weight"],
                )
                out = out.index_add(0, idx, y * slot_weight[start : start + n, None])
            start += n
        return out

    @torch.no_grad()
    def _forward(self, rows: Sequence[tuple[int, int, list[int]]]) -> list[torch.Tensor]:
        """One step over ``(slot, start_position, new_token_ids)`` rows; returns logits ``[T_i, V]``.

        Appends every row's keys/values to its slot. All TP ranks must call
        with the same rows (the collectives carry every row of the step).
        """
        embed = self.params["model.embed_tokens.weight"]
        xs = [F.embedding(torch.tensor(ids, device=self.device), embed) for _, _, ids in rows]
        for layer in range(self.cfg.layers):
            partials = [self._attention_partial(layer, x, slot, start) for x, (slot, start, _) in zip(xs, rows)]
            xs = [x + a for x, a in zip(xs, self._tp_sum(partials))]
            partials = [self._moe_partial(layer, x) for x in xs]
            xs = [x + m for x, m in zip(xs, self._tp_sum(partials))]
        norm, head = self.params["model.norm.weight"], self.params["lm_head.weight"]
        return [F.linear(Fn.rms_norm(x, norm, self.cfg.rms_eps), head) for x in xs]

    # -- public API ---------------------------------------------------------------

    @torch.no_grad()
    def prompt_logprobs(self, token_ids: Sequence[int]) -> torch.Tensor:
        """``[S]`` fp32 logprobs of ``token_ids`` under the engine (column 0 is 0).

        Uses (and frees) one KV slot; the design.md per-token convention.
        """
        slot = self.kv.allocate()
        try:
            (logits,) = self._forward([(slot, 0, list(token_ids))])
        finally:
            self.kv.release(slot)
        ids = torch.tensor(list(token_ids), device=self.device).unsqueeze(0)
        return Fn.token_logprobs(logits.unsqueeze(0), ids)[0]

    def _start(self, request: Mapping[str, Any]) -> _Sequence:
        prompt = list(request["prompt_ids"])
        room = self.cfg.max_position - len(prompt)
        return _Sequence(
            request=request,
            slot=self.kv.allocate(),
            generator=torch.Generator().manual_seed(int(request["seed"])),
            max_new=min(int(request["max_new_tokens"]), room),
            tokens=prompt,
        )

    def _advance(self, seq: _Sequence, logits: torch.Tensor) -> None:
        token, logprob = sample_token(
            logits[-1],
            temperature=float(seq.request["temperature"]),
            top_p=float(seq.request["top_p"]),
            generator=seq.generator,
        )
        seq.cached = len(seq.tokens)
        seq.tokens.append(token)
        seq.output_ids.append(token)
        seq.logprobs.append(logprob)
        if self.eos_token_id is not None and token == self.eos_token_id:
            seq.finish_reason = "eos"
        elif len(seq.output_ids) >= seq.max_new:
            seq.finish_reason = "length"

    @torch.no_grad()
    def generate(self, requests: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Generate for every request; results in request order (see module docstring)."""
        for request in requests:
            validate_request(request, vocab=self.cfg.vocab, max_position=self.cfg.max_position)
        ids = [r["request_id"] for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("rollout request_ids within one generate call must be unique")
        results: dict[int, dict[str, Any]] = {}
        waiting = list(enumerate(requests))
        running: list[tuple[int, _Sequence]] = []
        while waiting or running:
            admitted: list[tuple[int, _Sequence]] = []
            while waiting and len(running) + len(admitted) < self.max_batch_size:
                index, request = waiting.pop(0)
                if int(request["max_new_tokens"]) == 0:
                    results[index] = make_result(request, [], [], "length", self.weight_version)
                    continue
                admitted.append((index, self._start(request)))
            step = running + admitted
            if not step:
                continue
            rows = [(seq.slot, seq.cached, seq.tokens[seq.cached :]) for _, seq in step]
            for (_, seq), logits in zip(step, self._forward(rows)):
                self._advance(seq, logits)
            running = []
            for index, seq in step:
                if seq.finish_reason is None:
                    running.append((index, seq))
                else:
                    self.kv.release(seq.slot)
                    results[index] = make_result(
                        seq.request, seq.output_ids, seq.logprobs, seq.finish_reason, self.weight_version
                    )
        return [results[i] for i in range(len(requests))]
