"""``EngineWorker``: one TP rank of an engine plus its rollout profiler.

This is the unit that owns the device (vLLM's GPU worker): the outer
``RolloutWorker`` actor hosts it directly for a sync TP=1 engine; otherwise
one lives in every internal engine process. Its public methods are the RPC
surface the actor fans out to (``collective_rpc`` style): every TP rank must
receive the same calls in the same order.

Profiler placement (docs/plugins.md section 4): the engine-init window opens in
the constructor *before* the engine is created and stays open through
warm-up; the owner closes it with ``end_engine_initialization()`` (the same
token, kept by the hooks). A failing construction still closes the window
and the profiler before re-raising.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from harness.plugins.loader import load_rollout_profiler
from harness.plugins.rollout_hooks import RolloutLifecycleRPC, RolloutProfilerHooks
from harness.rollout.native.engine import Engine, as_model_config
from harness.spec.typed import Workload, as_workload

WARMUP_REQUEST = {
    "request_id": "__warmup__",
    "prompt_ids": [0],
    "max_new_tokens": 1,
    "seed": 0,
    "temperature": 0.0,
    "top_p": 1.0,
}


def initial_weights(spec: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The step-0 policy weights: the reference model's deterministic init for the spec's ``seed``."""
    from harness.model.qwen3_moe import build_reference_model

    spec = as_workload(spec)
    model = build_reference_model(as_model_config(spec.model), spec.seed)
    return {name: t.detach() for name, t in model.state_dict().items()}


def draw_initial_weights(spec: Mapping[str, Any]) -> Future:
    """``initial_weights(spec)``'s values, drawn in a background thread (``reference_state_dict``:
    the same draws without building the modules, bit for bit): a GPU engine's start-up
    (profiler, window, device) goes on meanwhile. Its ops run on that thread, which no
    thread-local operator counter observes; the CPU keeps ``initial_weights`` (its engines'
    start dispatches the operators it always did)."""
    from harness.model.qwen3_moe import reference_state_dict

    spec = as_workload(spec)
    pool = ThreadPoolExecutor(1, thread_name_prefix="initial-weights")
    try:
        return pool.submit(reference_state_dict, as_model_config(spec.model), spec.seed)
    finally:
        pool.shutdown(wait=False)


def resolve_eos_token_id(spec: Mapping[str, Any]) -> int:
    """The stop token of every rollout engine: the package tokenizer's EOS (``<|im_end|>``).

    The workload schema declares no stop token of its own (``rollout`` has no
    ``eos_token_id``), so ``spec`` only names whose engine asks. The tokenizer is
    package data: failing to load it is an error, never an engine that silently
    stops on ``max_new_tokens`` only (that would change every rollout).
    """
    from harness.envs.tokenizer import load_tokenizer

    del spec
    return int(load_tokenizer().eos_token_id)


def configure_determinism(device: str = "cpu") -> None:
    """One thread, deterministic kernels: reruns are bit-identical (on cuda,
    cuBLAS gets the fixed workspace deterministic mode requires; on a pinned CPU
    run, the portable kernels: ``harness.portable.enter_process``)."""
    from harness import code_identity
    from harness.portable import enter_process

    code_identity.check_process("a rollout engine process")  # the driver's harness, file for file
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    enter_process(device)


class EngineWorker(RolloutLifecycleRPC):
    def __init__(
        self,
        spec: Workload,
        *,
        tp_rank: int = 0,
        tp_size: int = 1,
        tp_group: Any = None,
        profiler_rank: int,
        weights: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        # spec: the plan's typed workload, received as a value (pickled by EngineProcesses)
        drawn = draw_initial_weights(spec) if weights is None and spec.platform.device != "cpu" else None
        configure_determinism(spec.platform.device)
        self.tp_rank = tp_rank
        self.hooks = RolloutProfilerHooks(load_rollout_profiler(rank=profiler_rank))
        with self.hooks.engine_init_or_close("engine"):
            self.engine = Engine(
                as_model_config(spec.model),
                weights if weights is not None else drawn.result() if drawn is not None else initial_weights(spec),
                tp_rank=tp_rank,
                tp_size=tp_size,
                tp_group=tp_group,
                max_batch_size=spec.rollout.max_batch_size,
                device="cpu" if spec.platform.device == "cpu" else "cuda",
                eos_token_id=resolve_eos_token_id(spec),
            )
            self.engine.generate([WARMUP_REQUEST])
        from harness.refit.broadcast import SideGroupSlot

        self._side_group = SideGroupSlot()  # the session's refit side group (built by the first broadcast)

    # -- generation ------------------------------------------------------------------
    def generate(self, requests: list[dict]) -> list[dict]:
        return self.engine.generate(requests)

    # -- weights ------------------------------------------------------------------------
    def weight_version(self) -> int:
        return self.engine.weight_version

    def set_weight_version(self, version: int) -> int:
        """Resume support: continue the version count of the run being resumed."""
        self.engine.weight_version = int(version)
        return self.engine.weight_version

    def state_dict_info(self) -> dict:
        return self.engine.state_dict_info()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.engine.state_dict()

    def receive_weights_zmq(self, *, address: str, timeout_ms: int) -> int:
        from harness.refit.zmq_stream import receive_weights_zmq

        receive_weights_zmq(
            address=address,
            state_dict_info=self.engine.state_dict_info(),
            load_fn=self.engine.load_weights,
            timeout_ms=timeout_ms,
        )
        self.engine.weight_version += 1
        return self.engine.weight_version

    def receive_weights_broadcast(
        self, *, host: str, port: int, world_size: int, rank: int, buffer_size_bytes: int, src: int = 0,
        timeout_s: float = 120.0, prefix: str = "harness-refit",
    ) -> int:
        """One broadcast refit. The side group is joined (as a store client) by the first
        call and reused while (host, port, world_size, rank, prefix) stay the same."""
        from harness.refit.broadcast import receive_broadcast

        group = self._side_group.join(host=host, port=port, rank=rank, world_size=world_size,
                                      timeout_s=timeout_s, prefix=prefix)
        receive_broadcast(
            group,
            state_dict_info=self.engine.state_dict_info(),
            load_fn=self.engine.load_weights,
            buffer_size_bytes=buffer_size_bytes,
            src=src,
        )
        self.engine.weight_version += 1
        return self.engine.weight_version

    def side_groups(self) -> list[dict]:
        """The refit side group this rank holds: ``[]`` or one signature dict."""
        return self._side_group.describe()

    def close_side_groups(self) -> None:
        """Close the held side group (idempotent; shutdown calls it)."""
        self._side_group.close()
