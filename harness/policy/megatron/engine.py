"""`MegatronPolicyEngine`: the megatron-core policy backend behind the same
methods as `harness.policy.engine.PolicyEngine` (train, split API,
get_logprobs, get_reference_logprobs, hf_state_dict, checkpoints).

One rank = one process; the default process group must already exist
(`harness.policy.engine.init_distributed`). On `platform.device: cpu` the
compatibility layer (`compat.apply_cpu_compat`) is applied first.

Supported layouts (this revision): pp == 1, cp == 1, etp == 1, any tp
(with sp), ep and dp that satisfy megatron's grids. The loss is the harness
`ClippedPGLoss` on full-vocab logprobs (GPTModel `parallel_output=False`),
so loss semantics, global-count normalisation, metrics and the split-API
state machine are the native engine's. Gradient reductions mirror
megatron's `finalize_model_grads`: sequence-parallel-tagged and q/k
layernorm weights are summed over tp, dense weights over dp-cp, experts
over the expert-data-parallel group; the global grad norm counts each
shard once.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.distributed as dist

from harness.algos.loss import ClippedPGLoss, aggregate_microbatch_metrics, global_valid_counts
from harness.model import functional as Fn
from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.parallel import data as dp_data
from harness.policy.checkpoint import ShardedCheckpoint
from harness.policy.engine import TRAIN_KEYS, seed_rank
from harness.policy.split_step import SplitTrainStep
from harness.policy.megatron import compat
from harness.policy.megatron.model import NameMap, build_gpt_model, is_expert, is_tp_sharded


class MegatronLayoutError(ValueError):
    pass


def check_layout(spec: Mapping[str, Any]) -> None:
    """Refuse layouts this backend does not run yet, naming the field."""
    p = spec["policy"]
    if int(p["cp"]) > 1:
        try:
            import transformer_engine  # noqa: F401
        except ImportError:
            raise MegatronLayoutError(
                f"policy.cp={p['cp']}: megatron-core context parallelism needs Transformer Engine "
                "(TEDotProductAttention), which is not importable here; use policy.cp: 1 "
                "or policy.backend: native"
            ) from None
        raise MegatronLayoutError("policy.cp > 1 with the megatron backend is not wired up yet; use policy.cp: 1")
    if int(p["pp"]) != 1:
        raise MegatronLayoutError(f"policy.pp={p['pp']}: the megatron backend runs pp == 1 only in this revision")
    if int(p["etp"]) != 1:
        raise MegatronLayoutError(f"policy.etp={p['etp']}: the megatron backend supports etp == 1 only")
    if int(p["tp"]) > 1 and not p["sp"]:
        raise MegatronLayoutError("policy.sp must be true with policy.tp > 1 (megatron MoE + TP needs sequence parallel)")


class MegatronPolicyEngine(SplitTrainStep, ShardedCheckpoint):
    backend = "megatron"

    def __init__(self, spec: Mapping[str, Any], rank: int, *, topology: Any = None) -> None:
        self.spec = spec
        self.rank = rank
        policy = spec["policy"]
        self.device = spec.get("platform", {}).get("device", "cpu")
        check_layout(spec)
        self.cfg = ModelConfig.from_spec(spec)
        world = dist.get_world_size()
        expected = policy["tp"] * policy["pp"] * policy["cp"] * policy["dp"]
        if world != expected:
            raise ValueError(f"world size {world} != policy.tp*pp*cp*dp = {expected}")
        compat.apply_cpu_compat(self.device)
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        self.ps = ps
        if not ps.model_parallel_is_initialized():
            # sizes from the spec the topology planner validated (same order, tp-cp-ep-dp-pp)
            ps.initialize_model_parallel(
                tensor_model_parallel_size=int(policy["tp"]),
                pipeline_model_parallel_size=int(policy["pp"]),
                context_parallel_size=int(policy["cp"]),
                expert_model_parallel_size=int(policy["ep"]),
                expert_tensor_parallel_size=int(policy["etp"]),
            )
        model_parallel_cuda_manual_seed(int(spec["seed"]))
        seed_rank(spec["seed"], rank)
        self.coords = {
            "tp": ps.get_tensor_model_parallel_rank(),
            "pp": ps.get_pipeline_model_parallel_rank(),
            "cp": ps.get_context_parallel_rank(),
            "dp": ps.get_data_parallel_rank(),
            "ep": ps.get_expert_model_parallel_rank(),
            "edp": ps.get_expert_data_parallel_rank(),
        }
        self.tp = int(policy["tp"])
        self.seq_len = int(policy["seq_len"])
        self.mbs = int(policy["micro_batch_size"])
        self.model = build_gpt_model(self.cfg, policy, self.device, pre_process=True, post_process=True)
        self.names = NameMap(self.cfg, self.tp, self.coords["tp"], int(policy["ep"]), self.coords["ep"], 0)
        full = build_reference_model(self.cfg, spec["seed"]).state_dict()
        self.full_names = list(full)
        self.full_shapes = {k: tuple(v.shape) for k, v in full.items()}
        self.named = [(n, p) for n, p in self.model.named_parameters()]
        with torch.no_grad():
            for n, p in self.named:
                value = self.names.to_megatron(n, full)
                if tuple(value.shape) != tuple(p.shape):
                    raise RuntimeError(f"{n}: HF value {tuple(value.shape)} != megatron shape {tuple(p.shape)}")
                p.copy_(value.to(p.dtype))
        del full
        self.reference_state = {n: p.detach().clone().cpu() for n, p in self.named}
        opt = policy["optimizer"]
        self.lr, self.wd = float(opt["lr"]), float(opt["weight_decay"])
        self.max_grad_norm = opt.get("max_grad_norm")
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self.named], lr=self.lr, weight_decay=self.wd,
            betas=(float(opt["beta1"]), float(opt["beta2"])), eps=float(opt["eps"]), foreach=False,
        )
        self.loss_fn = ClippedPGLoss(spec["grpo"]["loss"])
        self.is_last = True  # pp == 1
        self.steps_done = 0
        self._split: dict[str, Any] | None = None
        self._dp_group = ps.get_data_parallel_group(with_context_parallel=True) if ps.get_data_parallel_world_size(with_context_parallel=True) > 1 else None
        self._tp_group = ps.get_tensor_model_parallel_group() if self.tp > 1 else None
        self._edp_group = ps.get_expert_data_parallel_group() if ps.get_expert_data_parallel_world_size() > 1 else None

    # -- forward ------------------------------------------------------------------------

    def _logprobs(self, ids: torch.Tensor) -> torch.Tensor:
        dev = "cuda" if self.device == "cuda" else "cpu"
        ids = ids.to(dev)
        pos = torch.arange(ids.shape[1], device=dev).unsqueeze(0).expand_as(ids)
        logits = self.model(ids, pos, None)
        return Fn.token_logprobs(logits, ids).cpu()

    def _microbatches(self, batch: Mapping[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        b = batch["input_ids"].shape[0]
        if b == 0 or b % self.mbs:
            raise ValueError(
                f"policy rank {self.rank} (dp {self.coords['dp']}): batch of {b} samples is not a positive "
                f"multiple of policy.micro_batch_size={self.mbs}"
            )
        return [{k: v[i : i + self.mbs] for k, v in batch.items()} for i in range(0, b, self.mbs)]

    def _forward_backward(self, batch, global_seqs: float, global_toks: float) -> list[dict[str, float]]:
        for key in TRAIN_KEYS:
            if key not in batch:
                raise ValueError(f"policy rank {self.rank}: train batch is missing field {key!r}")
        self.model.train()
        metrics = []
        for mb in self._microbatches(batch):
            lp = self._logprobs(mb["input_ids"])
            loss, met = self.loss_fn(lp, mb, global_seqs, global_toks)
            loss.backward()
            metrics.append(met)
        return metrics

    # -- gradients --------------------------------------------------------------------------

    def _reduce_gradients(self) -> None:
        tp_sum, dense, expert = [], [], []
        for n, p in self.named:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if is_expert(n):
                expert.append(p.grad)
                continue
            if getattr(p, "sequence_parallel", False) or "q_layernorm" in n or "k_layernorm" in n or n.endswith("router.weight"):
                tp_sum.append(p.grad)
            dense.append(p.grad)
        dp_data._all_reduce_flat(tp_sum, self._tp_group)
        dp_data._all_reduce_flat(dense, self._dp_group)
        dp_data._all_reduce_flat(expert, self._edp_group)

    def _grad_norm(self) -> float:
        sq = torch.zeros((), dtype=torch.float64)
        c = self.coords
        for n, p in self.named:
            if is_expert(n):
                own = c["edp"] == 0
            else:
                own = c["dp"] == 0 and c["cp"] == 0 and (is_tp_sharded(n) or c["tp"] == 0)
            if own:
                sq += p.grad.double().pow(2).sum()
        if dist.get_world_size() > 1:
            dist.all_reduce(sq)
        return float(sq.sqrt())

    def _optimizer_step(self, grad_scale: float | None = None) -> float:
        self._reduce_gradients()
        if grad_scale is not None:
            for _, p in self.named:
                p.grad.mul_(grad_scale)
        norm = self._grad_norm()
        dp_data.clip_gradients([p for _, p in self.named], norm, self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        return norm

    def _combine_over_dp(self, per_mb: list[dict[str, float]]) -> dict[str, float]:
        local = aggregate_microbatch_metrics(per_mb)
        if self._dp_group is None:
            return local
        gathered: list[Any] = [None] * dist.get_world_size(self._dp_group)
        dist.all_gather_object(gathered, local, group=self._dp_group)
        return aggregate_microbatch_metrics(gathered)

    def _step_metrics(self, loss_metrics, norm, seqs, toks) -> dict[str, float]:
        return {**loss_metrics, "grad_norm": norm, "lr": self.lr, "wd": self.wd,
                "global_valid_seqs": seqs, "global_valid_toks": toks}

    # -- monolithic -------------------------------------------------------------------------

    def train(self, batch: Mapping[str, torch.Tensor], eval_mode: bool = False) -> dict[str, float]:
        if self._split is not None:
            raise RuntimeError(f"policy rank {self.rank}: train() called while a split train step is open")
        seqs, toks = global_valid_counts(batch)
        seqs, toks = dp_data.all_reduce_counts([seqs, toks], self._dp_group)
        self.optimizer.zero_grad(set_to_none=True)
        if eval_mode:
            with torch.no_grad():
                lp = self.get_logprobs(batch)
                per_mb = [self.loss_fn(lp[i : i + self.mbs], {k: v[i : i + self.mbs] for k, v in batch.items()}, seqs, toks)[1]
                          for i in range(0, lp.shape[0], self.mbs)]
            return self._combine_over_dp(per_mb)
        per_mb = self._forward_backward(batch, seqs, toks)
        combined = self._combine_over_dp(per_mb)
        norm = self._optimizer_step()
        return self._step_metrics(combined, norm, seqs, toks)

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
        self.model.eval()
        outs = [self._logprobs(ids[i : i + self.mbs]) for i in range(0, ids.shape[0], self.mbs)]
        return torch.cat(outs)[:b].to(torch.float32)

    @torch.no_grad()
    def get_reference_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        current = {n: p.detach().clone() for n, p in self.named}
        try:
            for n, p in self.named:
                p.copy_(self.reference_state[n])
            return self.get_logprobs(batch)
        finally:
            for n, p in self.named:
                p.copy_(current[n])

    # -- full weights (refit export) ------------------------------------------------------------

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Full HF-named tensors on policy rank 0 (collective; {} elsewhere)."""
        c = self.coords
        mine = []
        for n, p in self.named:
            if is_expert(n):
                own = c["edp"] == 0
            else:
                own = c["dp"] == 0 and c["cp"] == 0 and (is_tp_sharded(n) or c["tp"] == 0)
            if own:
                mine.append((n, c["tp"], c["ep"], p.detach().cpu().clone()))
        gathered: list[Any] | None = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if self.rank != 0:
            return {}
        shards: dict[tuple[str, int], dict[int, torch.Tensor]] = {}
        for pieces in gathered:  # type: ignore[union-attr]
            for n, tp_rank, ep_rank, t in pieces:
                key = (n, ep_rank if is_expert(n) else 0)
                shards.setdefault(key, {})[tp_rank if is_tp_sharded(n) else 0] = t
        out: dict[str, torch.Tensor] = {}
        ep = int(self.spec["policy"]["ep"])
        for (n, ep_rank), parts in shards.items():
            nm = NameMap(self.cfg, self.tp, 0, ep, ep_rank, 0)
            out.update(nm.to_hf(n, [parts[r] for r in sorted(parts)]))
        missing = [k for k in self.full_names if k not in out]
        if missing:
            raise RuntimeError(f"hf_state_dict: no rank owns {missing[:3]}{'...' if len(missing) > 3 else ''}")
        for k in self.full_names:
            if tuple(out[k].shape) != self.full_shapes[k]:
                raise RuntimeError(f"hf_state_dict: {k} assembled to {tuple(out[k].shape)}, expected {self.full_shapes[k]}")
        return {k: out[k] for k in self.full_names}

    # -- checkpoints ------------------------------------------------------------------------------

