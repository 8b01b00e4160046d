"""`MegatronPolicyEngine`: the megatron-core policy backend behind the same
methods as the native engine (the `harness.registry.policy.PolicyEngine` role: train,
split API, get_logprobs, get_reference_logprobs, hf_state_dict, checkpoints).

One rank = one process; the default process group must already exist
(`harness.policy.distributed.init_distributed`). On `platform.device: cpu` the
compatibility layer (`compat.apply_cpu_compat`) is applied first.

Supported layouts (this revision): cp == 1, etp == 1, any tp (with sp), pp
(even or `pp_layout`), ep and dp that satisfy megatron's grids. Forward and
backward passes (also forward-only logprobs) run through megatron-core's own
pipeline schedule (`get_forward_backward_func`: no pipelining at pp == 1,
non-interleaved 1F1B at pp > 1) with `pre_process` / `post_process` stage
models holding the planner's stage layer split. The loss is the harness
`ClippedPGLoss` on full-vocab logprobs (GPTModel `parallel_output=False`),
so loss semantics, global-count normalisation, metrics and the split-API
state machine are the native engine's. Gradient reductions mirror
megatron's `finalize_model_grads`: sequence-parallel-tagged and q/k
layernorm weights are summed over tp, dense weights over dp-cp, experts
over the expert-data-parallel group; the global grad norm counts each
shard once.

On cuda (issue 20) the local experts run as two grouped GEMMs instead of megatron's
per-expert loop (`grouped_experts`; same parameters) and AdamW takes the multi-tensor
kernels (`FOREACH_ADAMW_ON_CUDA`); the CPU keeps both loops, so no CPU golden moved.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

from harness import ops
from harness.model.config import ModelConfig
from harness.model.qwen3_moe import reference_state_dict
from harness.parallel import data as dp_data
from harness.parallel.groups import stage_layers
from harness.policy.checkpoint import ShardedCheckpoint
from harness.policy.common import EngineCommon
from harness.policy.megatron import compat
from harness.policy.megatron.groups import harness_group_names
from harness.policy.megatron.host_pages import register_host_pages
from harness.policy.megatron.model import (
    NameMap,
    build_gpt_model,
    is_expert,
    is_tp_sharded,
)
from harness.policy.seeding import seed_rank
from harness.policy.shard_gather import gather_tagged
from harness.policy.train_step import TrainStep
from harness.spec.typed import as_workload


class MegatronLayoutError(ValueError):
    pass


def check_layout(spec: Mapping[str, Any]) -> None:
    """Refuse layouts this backend does not run yet, naming the field."""
    p = as_workload(spec).policy
    if p.cp > 1:
        try:
            import transformer_engine  # noqa: F401
        except ImportError:
            raise MegatronLayoutError(
                f"policy.cp={p.cp}: megatron-core context parallelism needs Transformer Engine "
                "(TEDotProductAttention), which is not importable here; use policy.cp: 1 "
                "or policy.backend: native"
            ) from None
        raise MegatronLayoutError("policy.cp > 1 with the megatron backend is not wired up yet; use policy.cp: 1")
    if p.etp != 1:
        raise MegatronLayoutError(f"policy.etp={p.etp}: the megatron backend supports etp == 1 only")
    if p.tp > 1 and not p.sp:
        raise MegatronLayoutError(
            "policy.sp must be true with policy.tp > 1 (megatron MoE + TP needs sequence parallel)"
        )


class MegatronPolicyEngine(EngineCommon, TrainStep, ShardedCheckpoint):
    backend = "megatron"
    DEVICE_STATE_DICT = True  # hf_state_dict(on_device=True) in a 1-rank world: the CUDA IPC refit source
    # on cuda AdamW runs torch's multi-tensor kernels (megatron's own recipes use a fused
    # multi-tensor Adam); ~1000 parameters stepped one by one cost ~10k launches a step
    FOREACH_ADAMW_ON_CUDA = True

    def __init__(self, spec: Mapping[str, Any], rank: int, *, topology: Any = None) -> None:
        spec = self._bind(spec, rank)
        policy = spec.policy
        self.device = spec.platform.device
        check_layout(spec)
        self.cfg = ModelConfig.from_spec(spec.model)
        # the initial weights (seconds of serial CPU draws for the medium model) are drawn on a
        # thread of their own while megatron builds its groups and model; the same values
        draw = ThreadPoolExecutor(1, thread_name_prefix="reference-weights")
        drawn = draw.submit(reference_state_dict, self.cfg, spec.seed)
        draw.shutdown(wait=False)
        world = dist.get_world_size()
        if world != policy.world_size:
            raise ValueError(f"world size {world} != policy.tp*pp*cp*dp = {policy.world_size}")
        compat.apply_cpu_compat(self.device)
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        self.ps = ps
        if not ps.model_parallel_is_initialized():
            # sizes from the spec the topology planner validated (same order, tp-cp-ep-dp-pp);
            # groups described with the harness kinds (tp, pp, dp, ep, edp, ...)
            with harness_group_names(ps):
                ps.initialize_model_parallel(
                    tensor_model_parallel_size=policy.tp,
                    pipeline_model_parallel_size=policy.pp,
                    context_parallel_size=policy.cp,
                    expert_model_parallel_size=policy.ep,
                    expert_tensor_parallel_size=policy.etp,
                )
        model_parallel_cuda_manual_seed(spec.seed)
        seed_rank(spec.seed, rank)
        self.coords = {
            "tp": ps.get_tensor_model_parallel_rank(),
            "pp": ps.get_pipeline_model_parallel_rank(),
            "cp": ps.get_context_parallel_rank(),
            "dp": ps.get_data_parallel_rank(),
            "ep": ps.get_expert_model_parallel_rank(),
            "edp": ps.get_expert_data_parallel_rank(),
        }
        self.tp = policy.tp
        self.seq_len = policy.seq_len
        self.mbs = policy.micro_batch_size
        pp, stage = policy.pp, self.coords["pp"]
        self.stage_layers = stage_layers(self.cfg.layers, pp, policy.pp_layout)[stage]
        self.model = build_gpt_model(
            self.cfg, policy, self.device, pre_process=stage == 0, post_process=stage == pp - 1
        )
        built = len(self.model.decoder.layers)
        first = self.model.decoder.layers[0].layer_number - 1 if built else self.stage_layers.start
        if built != len(self.stage_layers) or first != self.stage_layers.start:
            raise MegatronLayoutError(
                f"policy.pp_layout: megatron built layers {first}..{first + built - 1} on stage {stage}, "
                f"the planner's split is {self.stage_layers.start}..{self.stage_layers.stop - 1}"
            )
        self.layer_offset = self.stage_layers.start
        self.names = NameMap(
            self.cfg, self.tp, self.coords["tp"], policy.ep, self.coords["ep"], self.layer_offset
        )
        full = drawn.result()
        self.full_names = list(full)  # every HF name; each stage loads only its own
        self.full_shapes = {k: tuple(v.shape) for k, v in full.items()}
        self.named = [(n, p) for n, p in self.model.named_parameters()]
        with torch.no_grad():
            for n, p in self.named:
                value = self.names.to_megatron(n, full)
                if tuple(value.shape) != tuple(p.shape):
                    raise RuntimeError(f"{n}: HF value {tuple(value.shape)} != megatron shape {tuple(p.shape)}")
                p.copy_(value.to(p.dtype))
        del full
        self._init_training_state(spec)
        # the reference swap (every GRPO step after the first) copies these to the device:
        # page-locked in place they go at pinned speed, without a second host copy
        self._reference_pages = register_host_pages(self.reference_state.values()) if self.device == "cuda" else None
        self.is_last = stage == pp - 1
        with_cp = policy.cp > 1  # dense gradients over dp x cp ("dp" when cp == 1)
        self._dp_group = (
            ps.get_data_parallel_group(with_context_parallel=with_cp)
            if ps.get_data_parallel_world_size(with_context_parallel=with_cp) > 1
            else None
        )
        self._tp_group = ps.get_tensor_model_parallel_group() if self.tp > 1 else None
        self._edp_group = ps.get_expert_data_parallel_group() if ps.get_expert_data_parallel_world_size() > 1 else None
        self._checkpoint_loaded = False
        self._untrained_logprobs: tuple[torch.Tensor, torch.Tensor] | None = None  # (input_ids, logprobs)
        if self.device == "cuda" and world == 1:
            self.warm_forward()

    def warm_forward(self) -> None:
        """One forward-only microbatch of zeros (``[micro_batch_size, seq_len]``), its logprobs
        dropped: a 1-rank cuda engine pays its first forward's one-time costs (kernel loading,
        cuBLAS handles, allocator growth) during start-up instead of in the first GRPO step.
        Changes no state a later call reads (no gradients, no RNG draws, no logprob cache);
        collective where the forward is, so it only runs where all ranks do (``__init__``)."""
        ids = torch.zeros((self.mbs, self.seq_len), dtype=torch.long)
        self.model.eval()

        def on_output(m: int, logits: torch.Tensor):
            ops.token_logprobs(logits, ids.to(logits.device)).cpu()
            return logits.new_zeros(()), None

        with torch.no_grad():
            self._schedule([ids], on_output, forward_only=True)

    # -- forward (megatron's pipeline schedule) ------------------------------------------

    def _schedule(self, ids: list[torch.Tensor], on_output, *, forward_only: bool) -> list[Any]:
        """Run megatron-core's forward(-backward) schedule over the microbatches
        `ids` ([mbs, S] token ids each, the same on every stage). On the last stage
        `on_output(m, logits)` returns `(loss, data)` for microbatch m: the loss is
        backpropagated as is (`calculate_per_token_loss`: no rescaling by the
        schedule) and the list of `data` is returned; other stages return []."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        dev = "cuda" if self.device == "cuda" else "cpu"
        ids = [x.to(dev) for x in ids]
        seq = ids[0].shape[1]
        pos = torch.arange(seq, device=dev).unsqueeze(0)
        one = torch.ones((), dtype=torch.int)

        def forward_step(data_iterator, model):
            m = next(data_iterator)
            out = model(ids[m], pos.expand_as(ids[m]), None)

            def loss_func(output):
                loss, data = on_output(m, output)
                return loss, one, data

            return out, loss_func

        run = get_forward_backward_func()
        out = run(forward_step_func=forward_step, data_iterator=iter(range(len(ids))), model=self.model,
                  num_microbatches=len(ids), seq_length=seq, micro_batch_size=self.mbs,
                  forward_only=forward_only)
        return list(out) if self.is_last else []

    def _forward_backward(self, batch, global_seqs: float, global_toks: float) -> list[dict[str, float]]:
        self._check_train_batch(batch)
        mbs = self._microbatches(batch)
        self.model.train()

        def on_output(m: int, logits: torch.Tensor):
            lp = ops.token_logprobs(logits, mbs[m]["input_ids"].to(logits.device)).cpu()
            return self.loss_fn(lp, mbs[m], global_seqs, global_toks)

        return self._schedule([mb["input_ids"] for mb in mbs], on_output, forward_only=False)

    # -- gradients --------------------------------------------------------------------------

    def _reduce_gradients(self) -> None:
        tp_sum, dense, expert = [], [], []
        for n, p in self.named:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if is_expert(n):
                expert.append(p.grad)
                continue
            if (
                getattr(p, "sequence_parallel", False)
                or "q_layernorm" in n
                or "k_layernorm" in n
                or n.endswith("router.weight")
            ):
                tp_sum.append(p.grad)
            dense.append(p.grad)
        dp_data._all_reduce_flat(tp_sum, self._tp_group)
        dp_data._all_reduce_flat(dense, self._dp_group)
        dp_data._all_reduce_flat(expert, self._edp_group)

    def _owns(self, name: str) -> bool:
        """Whether this rank is the one designated owner of parameter ``name``'s
        piece of the full model (each piece counted / exported exactly once)."""
        c = self.coords
        if is_expert(name):
            return c["edp"] == 0
        return c["dp"] == 0 and c["cp"] == 0 and (is_tp_sharded(name) or c["tp"] == 0)

    def _grad_norm(self) -> float:
        sq = torch.zeros((), dtype=torch.float64, device=self.named[0][1].device)  # NCCL needs it on the GPU
        for n, p in self.named:
            if self._owns(n):
                sq += p.grad.double().pow(2).sum()
        if dist.get_world_size() > 1:
            dist.all_reduce(sq)
        return float(sq.sqrt())

    @property
    def split_dp_group(self):
        return self._dp_group

    # -- inference ------------------------------------------------------------------------------

    @torch.no_grad()
    def get_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        b = ids.shape[0]
        pad = (-b) % self.mbs
        if pad:
            ids = torch.cat([ids, ids.new_zeros((pad, ids.shape[1]))])
        mbs = [ids[i : i + self.mbs] for i in range(0, ids.shape[0], self.mbs)]
        self.model.eval()

        def on_output(m: int, logits: torch.Tensor):
            lp = ops.token_logprobs(logits, mbs[m].to(logits.device)).cpu()
            return logits.new_zeros(()), lp

        outs = self._schedule(mbs, on_output, forward_only=True)
        out = torch.cat(outs)[:b].to(torch.float32) if self.is_last else torch.empty(0)
        if self._untrained():
            self._untrained_logprobs = (batch["input_ids"].clone(), out.clone())
        return out

    def _untrained(self) -> bool:
        """A 1-rank world whose parameters are still the reference weights: no optimizer
        step taken and no checkpoint loaded since ``_init_training_state`` copied them."""
        return self.steps_done == 0 and not self._checkpoint_loaded and dist.get_world_size() == 1

    @torch.no_grad()
    def get_reference_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logprobs under the initial weights. While :meth:`_untrained` the parameters are
        those weights, so the logprobs :meth:`get_logprobs` last computed for the same
        ``input_ids`` are the answer bit for bit (the same deterministic forward of the
        same weights): the GRPO step 1's reference pass, weight swap included, is skipped.
        Otherwise the weights are swapped in (``EngineCommon``)."""
        cached = self._untrained_logprobs
        if cached is not None and self._untrained() and torch.equal(cached[0], batch["input_ids"]):
            return cached[1].clone()
        return super().get_reference_logprobs(batch)

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        self._checkpoint_loaded, self._untrained_logprobs = True, None
        if self._reference_pages is not None:  # unregistered before the tensors it covers go
            self._reference_pages.release()
        super().load_checkpoint(directory)
        if self._reference_pages is not None:
            self._reference_pages = register_host_pages(self.reference_state.values())

    # -- full weights (refit export) ------------------------------------------------------------

    def hf_state_dict(self, *, on_device: bool = False) -> dict[str, torch.Tensor]:
        """Full HF-named tensors on policy rank 0 (collective; {} elsewhere).

        ``on_device`` (the CUDA IPC refit's source, ``PolicyWorker.stream_weights``): in a
        1-rank world the tensors are built from the parameters on their device, without a
        host copy or gather; with more ranks the host path is used (host copies, one gather:
        ``harness.policy.shard_gather``)."""
        c = self.coords
        world = dist.get_world_size()
        if on_device and world == 1:
            gathered: list[Any] | None = [[(n, c["tp"], c["ep"], self.layer_offset, p.detach())
                                           for n, p in self.named if self._owns(n)]]
        else:
            mine = [(n, c["tp"], c["ep"], self.layer_offset, p.detach().cpu().clone())
                    for n, p in self.named if self._owns(n)]
            gathered = gather_tagged(mine, dst=0)
        if self.rank != 0:
            return {}
        shards: dict[tuple[str, int, int], dict[int, torch.Tensor]] = {}
        for pieces in gathered:  # type: ignore[union-attr]
            for n, tp_rank, ep_rank, offset, t in pieces:
                key = (n, ep_rank if is_expert(n) else 0, offset)  # stage-local names repeat over pp
                shards.setdefault(key, {})[tp_rank if is_tp_sharded(n) else 0] = t
        out: dict[str, torch.Tensor] = {}
        ep = self.spec.policy.ep
        for (n, ep_rank, offset), parts in shards.items():
            nm = NameMap(self.cfg, self.tp, 0, ep, ep_rank, offset)
            out.update(nm.to_hf(n, [parts[r] for r in sorted(parts)]))
        missing = [k for k in self.full_names if k not in out]
        if missing:
            raise RuntimeError(f"hf_state_dict: no rank owns {missing[:3]}{'...' if len(missing) > 3 else ''}")
        for k in self.full_names:
            if tuple(out[k].shape) != self.full_shapes[k]:
                raise RuntimeError(
                    f"hf_state_dict: {k} assembled to {tuple(out[k].shape)}, expected {self.full_shapes[k]}"
                )
        return {k: out[k] for k in self.full_names}

    # -- checkpoints ------------------------------------------------------------------------------

