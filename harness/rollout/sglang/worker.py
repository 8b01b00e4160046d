"""``SGLangEngineWorker``: a real ``sglang.Engine`` behind the ``EngineWorker`` surface
(``rollout.backend: sglang``, cuda, sync, ``rollout.tp == 1``; docs/sglang.md).

Contract:

* start-up (inside the rollout profiler's engine-init window): the spec's step-0 weights
  (``initial_weights``) are written as an HF directory under ``work_dir/model`` and loaded
  by :class:`~harness.rollout.sglang.engine.SGLangEngine` (fp32 with SGLang's deterministic
  inference: batch-invariant kernels, so a request's tokens do not depend on its batch),
  then one warm-up request;
* ``generate``: one ``Engine.generate`` call per batch, results stamped with the weight
  version this worker holds;
* ``receive_weights_zmq`` (the colocated refit): the harness's bucket stream (CUDA IPC
  buffers from the policy on the same GPU) is received group by group; each group's
  tensors are copied out of the sender's buffer onto this GPU and handed to SGLang's own
  colocated entry point, ``update_weights_from_tensor`` (SGLang ships them to its scheduler
  process as CUDA IPC handles and loads them). Nothing goes through the host;
* ``receive_weights_broadcast``: the harness's side group (trainer rank 0 broadcasts each
  bucket), each bucket again loaded through ``update_weights_from_tensor``;
* the version count is this worker's (SGLang 0.5.17's calls take none);
* ``state_dict`` is refused: SGLang holds fused parameters (qkv, gate_up) in its own
  process. :meth:`weights_checksum` reads them back instead (SGLang's per-parameter hash).

Threads: every ``sglang.Engine`` call runs on one thread of this worker's own
(``sglang-engine``), where the engine was also built. SGLang drives its tokenizer manager
with ``loop.run_until_complete`` on the loop it found at construction; the rollout actor is
an asyncio actor whose loop is running, and a running loop cannot be run again. The caller
waits for each call, as it waits for the native engine.

The rollout profiler runs in this actor, around the engine calls: SGLang's scheduler
process (where the kernels run) is not profiled.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from harness.plugins.rollout_hooks import RolloutLifecycleRPC

T = TypeVar("T")

WARMUP_REQUEST = {
    "request_id": "__warmup__", "prompt_ids": [0], "max_new_tokens": 1, "seed": 0, "temperature": 0.0, "top_p": 1.0,
}


class SGLangEngineWorker(RolloutLifecycleRPC):
    """One SGLang engine (TP 1) in the rollout actor, with its rollout profiler."""

    def __init__(self, spec: Mapping[str, Any], *, profiler_rank: int, work_dir: str) -> None:
        from harness.model.config import ModelConfig
        from harness.plugins.loader import load_rollout_profiler
        from harness.plugins.rollout_hooks import RolloutProfilerHooks
        from harness.refit.broadcast import SideGroupSlot
        from harness.rollout.engine_worker import configure_determinism, initial_weights, resolve_eos_token_id
        from harness.rollout.sglang.engine import SGLangEngine
        from harness.rollout.vllm.hf_dir import write_hf_dir
        from harness.rollout.vllm.weights import state_dict_info
        from harness.spec.typed import as_workload

        spec = as_workload(spec)
        if spec.platform.device != "cuda" or spec.rollout.tp != 1 or spec.rollout.is_async:
            raise ValueError("rollout.backend sglang runs on platform.device cuda, rollout.tp 1, rollout.async "
                             f"false (got {spec.platform.device}, tp {spec.rollout.tp}, async "
                             f"{spec.rollout.is_async})")
        configure_determinism(spec.platform.device)
        cfg = ModelConfig.from_spec(spec.model)
        self._info = state_dict_info(cfg)
        self._version = 0
        self._side_group = SideGroupSlot()  # the session's refit side group (built by the first broadcast)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sglang-engine")
        self.hooks = RolloutProfilerHooks(load_rollout_profiler(rank=profiler_rank))
        with self.hooks.engine_init_or_close("SGLang engine"):
            eos = resolve_eos_token_id(spec)
            model_dir = write_hf_dir(cfg, os.path.join(work_dir, "model"), initial_weights(spec), eos_token_id=eos)
            self.engine = self._on_engine(lambda: SGLangEngine(
                model_dir, eos_token_id=eos, max_position=cfg.max_position, dtype=str(spec.model.dtype),
                seed=int(spec.seed)))
            self._on_engine(self.engine.generate, [WARMUP_REQUEST])

    def _on_engine(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the engine's thread and wait for it (module docstring)."""
        return self._thread.submit(fn, *args, **kwargs).result()

    # -- generation ------------------------------------------------------------------
    def generate(self, requests: list[dict]) -> list[dict]:
        self.engine.weight_version = self._version
        return self._on_engine(self.engine.generate, requests)

    # -- weights -----------------------------------------------------------------------
    def weight_version(self) -> int:
        return self._version

    def set_weight_version(self, version: int) -> int:
        self._version = int(version)
        return self._version

    def state_dict_info(self) -> dict:
        return dict(self._info)

    def state_dict(self) -> dict:
        raise NotImplementedError("an SGLang engine holds fused parameters in its scheduler process; "
                                  "read them back with weights_checksum()")

    def weights_checksum(self) -> dict:
        return self._on_engine(self.engine.weights_checksum)

    def _load_group(self, views: Any) -> None:
        """The zmq/broadcast ``load_fn``: one group, copied onto this GPU, into SGLang."""
        import torch

        named = [(name, torch.empty(view.shape, dtype=view.dtype, device="cuda")) for name, view in views]
        torch._foreach_copy_([t for _, t in named], [view for _, view in views])
        torch.cuda.current_stream().synchronize()  # the sender may reuse its buffer after the ACK
        ok, message = self._on_engine(self.engine.update_weights_from_tensor, named, flush_cache=True)
        if not ok:
            raise RuntimeError(f"SGLang update_weights_from_tensor refused the refit: {message}")

    def receive_weights_zmq(self, *, address: str, timeout_ms: int) -> int:
        from harness.refit.zmq_stream import receive_weights_zmq

        receive_weights_zmq(address=address, state_dict_info=self._info, load_fn=self._load_group,
                            timeout_ms=timeout_ms)
        self._version += 1
        return self._version

    def receive_weights_broadcast(self, *, host: str, port: int, world_size: int, rank: int,
                                  buffer_size_bytes: int, src: int = 0, timeout_s: float = 120.0,
                                  prefix: str = "harness-refit") -> int:
        from harness.refit.broadcast import receive_broadcast

        group = self._side_group.join(host=host, port=port, rank=rank, world_size=world_size,
                                      timeout_s=timeout_s, prefix=prefix)
        receive_broadcast(group, state_dict_info=self._info, load_fn=self._load_group,
                          buffer_size_bytes=buffer_size_bytes, src=src)
        self._version += 1
        return self._version

    def side_groups(self) -> list[dict]:
        return self._side_group.describe()

    def close_side_groups(self) -> None:
        self._side_group.close()

    def engine_pids(self) -> list[int]:
        return [os.getpid()]

    def shutdown_engine(self) -> None:
        try:
            self._on_engine(self.engine.shutdown)
        finally:
            self._thread.shutdown(wait=False)
