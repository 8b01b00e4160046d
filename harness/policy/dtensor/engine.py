"""`DTensorPolicyEngine`: the reference Qwen3-MoE (`harness.model.qwen3_moe`) on
torch's DTensor APIs, behind the same methods as the native engine (the
`harness.registry.policy.PolicyEngine` role: train, split API, get_logprobs, get_reference_logprobs, hf_state_dict,
checkpoints).

One rank = one process; the default process group must already exist
(`harness.policy.distributed.init_distributed`: gloo on CPU, NCCL on cuda). The
world is a 2-D device mesh ``(dp, tp)`` (tp innermost):

* tensor parallel (`parallelize_module` over ``tp``): embedding row-wise
  (vocab-parallel), q/k/v column-wise (local heads), o_proj row-wise (output
  all-reduced), lm_head column-wise with the logits gathered (full vocab on
  every tp rank); norms, router and experts replicated. No sequence parallel.
  The per-head q/k norms see only local heads, so their gradients are summed
  over tp after backward (the only manual reduction);
* FSDP2 (`fully_shard` over ``dp``) on every decoder layer and the root, with
  the reduce-scatter divide factor 1 and plain SUM reductions: losses are normalised by global counts,
  so dp gradients are summed, as on the native backend. Every expert gets a
  gradient each backward (`_touch_all_experts`): FSDP2 reduce-scatters only
  parameters with one, and the set must match on all dp ranks.

Not supported (refused up front, naming the field, by `check_layout`):
pp > 1, cp > 1, ep > 1, etp > 1, sp. LoRA (`policy.lora`, `lora.py`): the
base is frozen, only adapters are in the optimizer, reference weights and
checkpoints; refit exports merged weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from harness import ops
from harness.devices import local_device, moved
from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.parallel import data as dp_data
from harness.policy.checkpoint import ShardedCheckpoint
from harness.policy.common import EngineCommon
from harness.policy.dtensor import full_weights
from harness.policy.dtensor import lora as lora_mod
from harness.policy.seeding import seed_rank
from harness.policy.train_step import TrainStep
from harness.spec.typed import ModelSpec, PolicySpec


class DTensorLayoutError(ValueError):
    pass


def check_layout(policy: PolicySpec, model: ModelSpec) -> None:
    """Refuse what this backend does not run, naming the field."""
    for field in ("pp", "cp", "ep", "etp"):
        if getattr(policy, field) != 1:
            raise DTensorLayoutError(
                f"policy.{field}={getattr(policy, field)}: the dtensor backend supports {field} == 1 only "
                "(FSDP2 over dp and tensor parallel over tp); use policy.backend: native or megatron"
            )
    if policy.sp:
        raise DTensorLayoutError("policy.sp: the dtensor backend has no sequence parallel; set policy.sp: false")
    tp = policy.tp
    for field in ("heads", "kv_heads", "vocab"):
        if getattr(model, field) % tp:
            raise DTensorLayoutError(f"model.{field}={getattr(model, field)} is not divisible by policy.tp={tp}")
    if policy.lora_enabled:
        lora_mod.lora_config(policy.lora)


def _wait(t: torch.Tensor) -> torch.Tensor:
    """A collective's result, waited on (funcol results are async tensors)."""
    wait = getattr(t, "wait", None)
    return wait() if callable(wait) else t


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def hf_name(name: str) -> str:
    """Module parameter name -> HF checkpoint name (LoRA wrappers hold the base as ``.base``)."""
    return name.replace(".base.", ".")


def _tp_plan(model: nn.Module) -> dict[str, Any]:
    plan: dict[str, Any] = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    }
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in ("q_proj", "k_proj", "v_proj", "o_proj"):
            continue
        colwise = leaf != "o_proj"
        style = ColwiseParallel if colwise else RowwiseParallel
        if isinstance(module, lora_mod.LoRALinear):
            plan[f"{name}.base"] = style()
            # column-wise: A replicated, B column-wise; row-wise: A row-wise, B replicated
            plan[f"{name}.lora_B" if colwise else f"{name}.lora_A"] = style()
        else:
            plan[name] = style()
    return plan


def _touch_all_experts(module: nn.Module, _inputs: Any, output: Any) -> Any:
    """Forward hook on a `SparseMoE`: add ``0 * sum(expert weights)`` to its output,
    so experts that got no token still get a (zero) gradient. FSDP2 reduce-scatters
    only parameters with a gradient, and the set must be equal on every dp rank.
    The values do not change (``x + 0.0 == x``)."""
    out, router_logits = output
    zero = sum(p.sum() for p in module.experts.parameters() if p.requires_grad) * 0.0
    return (out + zero, router_logits) if isinstance(zero, torch.Tensor) else output


class DTensorPolicyEngine(EngineCommon, TrainStep, ShardedCheckpoint):
    backend = "dtensor"

    def __init__(self, spec: Mapping[str, Any], rank: int, *, topology: Any = None) -> None:
        spec = self._bind(spec, rank)
        policy = spec.policy
        check_layout(policy, spec.model)
        self.cfg = ModelConfig.from_spec(spec.model)
        dp, tp = policy.dp, policy.tp
        world = dist.get_world_size()
        if world != policy.world_size:
            raise ValueError(f"world size {world} != policy.tp*pp*cp*dp = {policy.world_size}")
        device = spec.platform.device
        self.device = local_device(rank, device)
        self.mesh = init_device_mesh("cuda" if device == "cuda" else "cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        self.coords = {"dp": self.mesh["dp"].get_local_rank(), "tp": self.mesh["tp"].get_local_rank(),
                       "pp": 0, "cp": 0, "ep": 0, "edp": self.mesh["dp"].get_local_rank()}
        self.tp = tp
        seed_rank(spec.seed, rank)
        self.seq_len = policy.seq_len
        self.mbs = policy.micro_batch_size
        model = build_reference_model(self.cfg, spec.seed)
        self.full_names = list(model.state_dict())
        self.full_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        self.lora = lora_mod.lora_config(policy.lora) if policy.lora_enabled else None
        if self.lora is not None:
            lora_mod.apply_lora(model, self.lora, spec.seed, self.coords["dp"])
        model.to(self.device)
        for layer in model.model.layers:
            layer.mlp.register_forward_hook(_touch_all_experts)
        if tp > 1:
            parallelize_module(model, self.mesh["tp"], _tp_plan(model))
        for layer in model.model.layers:
            fully_shard(layer, mesh=self.mesh["dp"])
        fully_shard(model, mesh=self.mesh["dp"])
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(1.0)  # global-count losses: dp gradients are summed
                m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM / AVG)
        self.model = model
        self.params = dict(model.named_parameters())
        self._flat: full_weights.FlatGather | bool | None = None  # made on the first export (False: n/a)
        # `named`: what trains (optimizer, reference state, checkpoints); all weights without LoRA
        self.named = [(n, p) for n, p in self.params.items() if p.requires_grad]
        self._tp_summed = [p for n, p in self.named if n.endswith(("q_norm.weight", "k_norm.weight"))]
        self._init_training_state(spec)
        self.is_last = True
        self._dp_group = self.mesh["dp"].get_group() if dp > 1 else None
        self._tp_group = self.mesh["tp"].get_group() if tp > 1 else None

    # -- forward / backward ------------------------------------------------------------

    def _logprobs(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] != self.seq_len:
            raise ValueError(f"input_ids has sequence length {ids.shape[1]}, expected policy.seq_len={self.seq_len}")
        logits, _ = self.model(ids)
        return ops.token_logprobs(_local(logits), ids)

    def _forward_backward(self, batch, global_seqs: float, global_toks: float) -> list[dict[str, float]]:
        self._check_train_batch(batch)
        self.model.train()
        metrics = []
        for mb in self._microbatches(batch):
            lp = self._logprobs(moved(mb["input_ids"], self.device))
            loss, met = self.loss_fn(moved(lp, torch.device("cpu")), mb, global_seqs, global_toks)
            loss.backward()
            metrics.append(met)
        return metrics

    def _reduce_gradients(self) -> None:
        for _, p in self.named:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self._tp_group is not None:
            dp_data._all_reduce_flat([_local(p.grad) for p in self._tp_summed], self._tp_group)

    def _counted(self, p: torch.Tensor) -> bool:
        """Whether this rank's local piece of `p` is counted in the norm (each element once)."""
        names = p.device_mesh.mesh_dim_names if isinstance(p, DTensor) else ()
        if self.tp > 1 and "tp" not in names and self.coords["tp"] != 0:
            return False
        if isinstance(p, DTensor):
            for dim, placement in enumerate(p.placements):
                if placement.is_replicate() and p.device_mesh.get_local_rank(dim) != 0:
                    return False
        return True

    def _grad_norm(self) -> float:
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for _, p in self.named:
            if self._counted(p):
                sq += _local(p.grad).double().pow(2).sum()
        if dist.get_world_size() > 1:
            dist.all_reduce(sq)
        return float(sq.sqrt())

    @property
    def split_dp_group(self):
        return self._dp_group

    # -- inference ---------------------------------------------------------------------------

    @torch.no_grad()
    def get_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logprobs `[B, S]` of this rank's dp shard (every rank; equal on tp peers)."""
        ids = batch["input_ids"]
        b = ids.shape[0]
        pad = (-b) % self.mbs
        if pad:
            ids = torch.cat([ids, ids.new_zeros((pad, ids.shape[1]))])
        self.model.eval()
        outs = [self._logprobs(moved(ids[i : i + self.mbs], self.device)) for i in range(0, ids.shape[0], self.mbs)]
        return moved(torch.cat(outs)[:b], torch.device("cpu")).to(torch.float32)

    # -- full weights (refit export) -----------------------------------------------------------

    def _full(self, name: str) -> torch.Tensor:
        """The full tensor of parameter `name` (collective over the mesh), waited on, on the CPU."""
        p = self.params[name].detach()
        full = _wait(p.full_tensor()) if isinstance(p, DTensor) else p
        return moved(full, torch.device("cpu")).clone()

    def _fulls(self) -> Mapping[str, torch.Tensor] | None:
        """Every parameter's full tensor from one gather (``full_weights.FlatGather``, rank 0;
        {} elsewhere), or None where that export does not apply (then `_full` per parameter)."""
        if self._flat is False:
            return None
        if self._flat is None:
            try:
                self._flat = full_weights.FlatGather(self.params)
            except full_weights.Unsupported:
                self._flat = False
                return None
        return self._flat.full(self.params)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Full HF-named tensors (LoRA: merged ``base + scale * B @ A``) on policy
        rank 0, in the reference model's order; collective over the world, {} elsewhere.
        On the CPU one gather brings every rank's shards to rank 0 (``full_weights``: the
        tensors `full_tensor()` returns, bit for bit); elsewhere every `full_tensor()` is
        waited on before the tensor is handed out."""
        fulls = self._fulls()
        if fulls is not None:
            if self.rank != 0:
                return {}
            full_of = fulls.__getitem__
        else:
            full_of = self._full
        out: dict[str, torch.Tensor] = {}
        for name in self.params:
            if ".lora_" in name:
                continue
            full = full_of(name)
            if name.endswith(".base.weight"):
                prefix = name[: -len("base.weight")]
                a, b = full_of(prefix + "lora_A.weight"), full_of(prefix + "lora_B.weight")
                full = lora_mod.merged_weight(full, a, b, self.lora["alpha"] / self.lora["rank"])
            out[hf_name(name)] = full
        if self.rank != 0:
            return {}
        missing = [k for k in self.full_names if k not in out]
        if missing:
            raise RuntimeError(f"hf_state_dict: no parameter for {missing[:3]}{'...' if len(missing) > 3 else ''}")
        for k in self.full_names:
            if tuple(out[k].shape) != self.full_shapes[k]:
                raise RuntimeError(f"hf_state_dict: {k} assembled to {tuple(out[k].shape)}, "
                                   f"expected {self.full_shapes[k]}")
        return {k: out[k] for k in self.full_names}
