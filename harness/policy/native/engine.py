"""`NativePolicyEngine`: one policy rank's model, optimizer and train step, without Ray
(`policy.backend: native`; the role is `harness.registry.policy.PolicyEngine`).

`PolicyWorker` (Ray actor) wraps it; tests can drive it directly from
`torch.multiprocessing` ranks. The default process group must already be
initialised over the policy world (`harness.policy.distributed.init_distributed`).

Train contract (NeMo RL):
- the batch a rank receives is its DP shard of one global batch; it is cut
  into microbatches of `policy.micro_batch_size` run through the pipeline
  schedule; one AdamW step per global batch;
- the loss of each microbatch is normalised by *global* valid sequence/token
  counts (summed over microbatches and DP ranks), so gradients add up to the
  whole-batch gradient; gradients are then summed over DP (`parallel.data`),
  clipped by the global norm (reported pre-clip as `grad_norm`); the step and
  `train` itself are every backend's (`train_step.py`), this module gives it the
  gradient reduction and norm over its own process groups;
- split API state machine (`split_step.py`): one open step per worker;
  `begin_train_step` while open -> RuntimeError("a train step is already open ...");
  `train_microbatch` / `finish_train_step` without an open step ->
  RuntimeError("no train step open ..."); `abort_train_step` is idempotent.
  Microbatches run with placeholder global counts of 1; `finish_train_step`
  all-reduces the counts, scales gradients by 1/toks (1/seqs for
  sequence-level loss) before clipping and rescales metrics per
  `loss_fn.metric_normalizations`.
Metrics are produced on last-stage ranks (others return {}); every loss
metric is already combined over microbatches and DP ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from harness.devices import local_device, moved
from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.parallel import data as dp_data
from harness.parallel.groups import (
    ProcessGroups,
    layout_from_spec,
    layout_from_topology,
    stage_layers,
    validate_policy_layout,
)
from harness.parallel.pipeline import run_pipeline, stage_info
from harness.policy.checkpoint import ShardedCheckpoint
from harness.policy.common import EngineCommon
from harness.policy.native.parallel_model import ParallelQwen3Moe
from harness.policy.seeding import seed_rank
from harness.policy.shard_gather import gather_tagged
from harness.policy.train_step import TrainStep


def _cpu_copy(t: torch.Tensor) -> torch.Tensor:
    return t.clone() if t.device.type == "cpu" else t.cpu()


class NativePolicyEngine(EngineCommon, TrainStep, ShardedCheckpoint):
    backend = "native"
    DEVICE_STATE_DICT = True  # hf_state_dict(on_device=True): the refit source for CUDA IPC staging
    NUMERICS_TAPS = True  # ParallelQwen3Moe calls harness.taps: the numerics surface (docs/locator.md)
    MASTER_WEIGHTS = True  # model.dtype bfloat16/float16: AdamW over fp32 masters (policy.master_weights)

    def __init__(self, spec: Mapping[str, Any], rank: int, *, topology: Any = None) -> None:
        spec = self._bind(spec, rank)
        policy = spec.policy
        self.cfg = ModelConfig.from_spec(spec.model)
        if topology is None:  # a world built without a run's plan (tests, suites/local_world.py)
            validate_policy_layout(policy, spec.model)  # else the plan checked it, before any process started
        world = dist.get_world_size()
        if world != policy.world_size:
            raise ValueError(f"world size {world} != policy.tp*pp*cp*dp = {policy.world_size}")
        seed_rank(spec.seed, rank)
        layout = layout_from_topology(topology, policy) if topology is not None else layout_from_spec(policy)
        self.groups = ProcessGroups.create(layout, rank)
        self.coords = self.groups.coords
        stages = stage_layers(self.cfg.layers, policy.pp, policy.pp_layout)
        stage = self.coords["pp"]
        full = build_reference_model(self.cfg, spec.seed).state_dict()
        self.full_names = list(full)
        self.full_shapes = {k: tuple(v.shape) for k, v in full.items()}
        self.seq_len = policy.seq_len
        self.mbs = policy.micro_batch_size
        self.device = local_device(rank, spec.platform.device)
        self.model = ParallelQwen3Moe(
            self.cfg, self.groups, stages[stage], full,
            seq_len=self.seq_len, is_first=stage == 0, is_last=stage == policy.pp - 1,
        ).to(self.device)
        del full
        self.named = self.model.hf_named_parameters()
        self.kinds = self.model.param_kinds()
        self._init_training_state(spec)
        self.is_last = self.model.is_last

    # -- pipeline driver ---------------------------------------------------------

    def _on_device(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``batch`` on this rank's device (tensors arrive and leave on the CPU)."""
        return {k: moved(v, self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def _stage_info(self):
        return stage_info(self.groups.ranks("pp"), self.rank, self.model.activation_shape(self.mbs),
                          self.cfg.torch_dtype(), self.device)

    def _forward_backward(self, batch, global_seqs: float, global_toks: float) -> list[dict[str, float]]:
        self._check_train_batch(batch)
        mbs = [self._on_device(mb) for mb in self._microbatches(batch)]
        info = self._stage_info()
        metrics: list[dict[str, float]] = []

        def stage_forward(m: int, x):
            out = self.model(mbs[m]["input_ids"], x)
            if not info.is_last:
                return out
            loss, met = self.loss_fn(out, mbs[m], global_seqs, global_toks)
            metrics.append(met)
            return loss

        self.model.train()
        run_pipeline(info, len(mbs), stage_forward, backward=True)
        return metrics

    # -- gradients (TrainStep's optimizer step) -------------------------------------

    def _reduce_gradients(self) -> None:
        dp_data.reduce_gradients(self.named, self.kinds, self.groups)

    def _grad_norm(self) -> float:
        return dp_data.global_grad_norm(self.named, self.kinds, self.coords)

    @property
    def split_dp_group(self):
        return self.groups["dp"]

    # -- inference ------------------------------------------------------------------

    @torch.no_grad()
    def get_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logprobs `[B, S]` of this rank's DP shard on last-stage ranks (an empty
        tensor elsewhere). B need not be a multiple of the microbatch size."""
        ids = batch["input_ids"]
        b = ids.shape[0]
        pad = (-b) % self.mbs
        if pad:
            ids = torch.cat([ids, ids.new_zeros((pad, ids.shape[1]))])
        ids = moved(ids, self.device)
        mbs = [ids[i : i + self.mbs] for i in range(0, ids.shape[0], self.mbs)]
        info = self._stage_info()
        self.model.eval()
        outs = run_pipeline(info, len(mbs), lambda m, x: self.model(mbs[m], x), backward=False)
        if not self.is_last:
            return torch.empty(0)
        return moved(torch.cat(outs)[:b], torch.device("cpu")).to(torch.float32)

    # -- full weights -------------------------------------------------------------------

    def _owned_shards(self, copy: bool = True) -> list[tuple[str, int | None, int, torch.Tensor]]:
        """(name, shard dim, tp rank, tensor) for the shards this rank is the
        designated owner of (each piece of the full model owned exactly once).
        ``copy``: a host copy of each (the CPU path); else the detached parameter itself."""
        c = self.coords
        dense_owner = c["dp"] == 0 and c["cp"] == 0
        out = []
        for name, p in self.named:
            spec = self.model.shard_specs[name]
            if spec.kind == dp_data.EXPERT:
                own = c["edp"] == 0
            elif spec.dim is None:
                own = dense_owner and c["tp"] == 0
            else:
                own = dense_owner
            if own:
                out.append((name, spec.dim, c["tp"], _cpu_copy(p.detach()) if copy else p.detach()))
        return out

    def hf_state_dict(self, *, on_device: bool = False) -> dict[str, torch.Tensor]:
        """Full HF-named tensors, assembled on policy rank 0 (collective over the
        world; other ranks return {}). Order = the reference model's order.

        Default: host copies, gathered in one tensor gather
        (``harness.policy.shard_gather.gather_tagged``: the CPU path, and what
        checksums and checkpoints read). ``on_device``: the tensors stay on
        the policy's device and are not copied where no assembly is needed -- a
        1-rank world returns the detached parameters themselves (valid until the
        next optimizer step); with more ranks only the shards' (name, shape,
        dtype) go through ``gather_object`` and the tensors travel by
        point-to-point ``send``/``recv`` on the device (NCCL on cuda). This is
        the refit's source for CUDA IPC staging (``stream_weights``)."""
        if not on_device:
            gathered = gather_tagged(self._owned_shards(), dst=0)
            if self.rank != 0:
                return {}
            return self._assemble(gathered)  # type: ignore[arg-type]
        mine = self._owned_shards(copy=False)
        world = dist.get_world_size()
        if world == 1:
            return self._assemble([mine], alias_single=True)
        meta = [(name, dim, tp_rank, tuple(t.shape), str(t.dtype).removeprefix("torch."))
                for name, dim, tp_rank, t in mine]
        metas: list[Any] | None = [None] * world if self.rank == 0 else None
        dist.gather_object(meta, metas, dst=0)
        if self.rank != 0:
            for *_, t in mine:
                dist.send(t.contiguous(), dst=0)
            return {}
        shards = [mine]
        for src in range(1, world):
            received = []
            for name, dim, tp_rank, shape, dtype in metas[src]:  # type: ignore[index]
                buf = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
                dist.recv(buf, src=src)
                received.append((name, dim, tp_rank, buf))
            shards.append(received)
        return self._assemble(shards, alias_single=True)

    def _assemble(self, gathered: list[list[tuple[str, int | None, int, torch.Tensor]]],
                  alias_single: bool = False) -> dict[str, torch.Tensor]:
        """The full tensors from every rank's owned shards (TP shards concatenated in rank order);
        ``alias_single``: a tensor held whole by one rank is returned as is, not concatenated."""
        pieces: dict[str, dict[int, torch.Tensor]] = {}
        dims: dict[str, int | None] = {}
        for shards in gathered:
            for name, dim, tp_rank, t in shards:
                pieces.setdefault(name, {})[tp_rank if dim is not None else 0] = t
                dims[name] = dim
        out = {}
        for name in self.full_names:
            parts = pieces.get(name)
            if parts is None:
                raise RuntimeError(f"hf_state_dict: no rank owns {name}")
            dim = dims[name]
            if dim is None or (alias_single and len(parts) == 1):
                out[name] = next(iter(parts.values()))
            else:
                out[name] = torch.cat([parts[r] for r in sorted(parts)], dim=dim)
            if tuple(out[name].shape) != self.full_shapes[name]:
                raise RuntimeError(
                    f"hf_state_dict: {name} assembled to {tuple(out[name].shape)}, expected {self.full_shapes[name]}"
                )
        return out
