"""The vLLM engine behind ``RolloutWorker`` (``rollout.backend: vllm``).

Two owners, chosen by the profiler placement (docs/vllm.md):

* ``VllmEngineWorker`` -- sync engine with ``rollout.tp == 1``: ``vllm.LLM``
  runs *in the actor process* (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``uni``
  executor), so the rollout profiler built here (rank ``RANK``) observes the
  model's work. It has the ``EngineWorker`` method surface (the actor's
  ``_local`` slot). The init window opens before ``LLM(...)`` and stays open
  through warm-up; the actor closes it with ``end_engine_initialization()``.
* ``VllmEngineProcesses`` -- ``rollout.tp > 1`` or ``rollout.async``: vLLM
  runs its workers in processes of its own (``mp`` executor; an async engine's
  core always runs in its own process). With a profiler configured the
  worker class is substituted (``profiling_worker``) and every internal
  worker builds its own profiler; the lifecycle is fanned out with
  ``collective_rpc``. It has the ``EngineProcesses`` surface (``call`` returns
  one value per internal rank, ``call_each`` takes per-rank kwargs, ``pids``,
  ``stop``), the actor's ``_procs`` slot.

Both start from the spec's step-0 weights written as an HF directory under
the run dir, generate with token-id prompts (``translate``), and refit through
the worker extension (``extension``) over the native bucket streams.

Before any engine is created: vLLM must be importable (``require_vllm``), a
custom ``rollout.worker_cls`` is refused (``resolve_worker_cls``), and the
actor has already applied the PP = 1 / EP = 1 topology gate.

Determinism: fp32, ``enforce_eager``, prefix caching off, one OpenMP thread
per worker (``VLLM_CPU_OMP_THREADS_BIND=nobind`` at TP 1, one core per rank
beyond), a seed per request. Sync batches are scheduled the same way on every
rerun.

On cuda (the official build) the same code runs with the GPU worker class;
the engine gets a bounded share of the GPU (``cuda_memory_kwargs``: it is
colocated with the policy) and ``VLLM_HOST_IP`` defaults to loopback.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from harness.model.config import ModelConfig
from harness.plugins.rollout_hooks import RolloutLifecycleRPC
from harness.rollout.vllm import profiling_worker, require_vllm, translate
from harness.rollout.vllm.extension import CONFIG_KEY
from harness.rollout.vllm.weights import state_dict_info, unpack_state
from harness.spec.typed import Workload, as_workload

EXTENSION_CLS = "harness.rollout.vllm.extension.HarnessVllmWorkerExtension"
WARMUP_REQUEST = {
    "request_id": "__warmup__", "prompt_ids": [0], "max_new_tokens": 1, "seed": 0, "temperature": 0.0, "top_p": 1.0,
}
_ids = itertools.count()


# -- configuration ------------------------------------------------------------------------
def resolve_worker_cls(spec: Mapping[str, Any], profiler_class_path: str | None) -> str | None:
    """The vLLM ``worker_cls`` to use; ``ValueError`` for an unsupported custom class.

    ``rollout.worker_cls`` may be null or one of the harness's profiling
    worker classes; anything else cannot host the in-worker rollout profiler
    and is refused here, before the engine is created. With a profiler and
    ``tp > 1`` or an async engine the profiling worker class is substituted.
    """
    spec = as_workload(spec)
    rollout = spec.rollout
    device = spec.platform.device
    ours = {profiling_worker.class_path("cpu"), profiling_worker.class_path("cuda")}
    custom = rollout.worker_cls
    if custom is not None and custom not in ours:
        raise ValueError(
            f"rollout.worker_cls {custom!r} is not supported with rollout.backend: vllm "
            f"(it cannot host the in-worker rollout profiler); use null or one of {sorted(ours)}"
        )
    internal = rollout.tp > 1 or rollout.is_async
    if profiler_class_path and internal:
        return profiling_worker.class_path(device)
    return custom


def engine_env(spec: Mapping[str, Any], *, in_process: bool) -> dict[str, str]:
    """Environment vLLM reads at engine creation (values already set in the environment win,
    except the multiprocessing switch, which the placement decides)."""
    spec = as_workload(spec)
    tp = spec.rollout.tp
    ncpu = os.cpu_count() or 1
    cuda = {} if spec.platform.device != "cuda" else {
        # on a machine whose interfaces do not route, the engine start waits forever
        # for its own address (measured on the H200 machine); loopback always works
        "VLLM_HOST_IP": os.environ.get("VLLM_HOST_IP", "127.0.0.1"),
    }
    return {
        **cuda,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get(
            "VLLM_CPU_OMP_THREADS_BIND", "nobind" if tp == 1 else "|".join(str(r % ncpu) for r in range(tp))
        ),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1",
        "VLLM_WORKER_MULTIPROC_METHOD": os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "spawn"),
        "TOKENIZERS_PARALLELISM": "false",
    }


def engine_kwargs(spec: Mapping[str, Any], model_dir: str, *, worker_cls: str | None,
                  profiler_class_path: str | None, rank_prefix: int) -> dict[str, Any]:
    """``vllm.LLM`` / ``AsyncEngineArgs`` keyword arguments for the spec."""
    spec = as_workload(spec)
    rollout = spec.rollout
    model = ModelConfig.from_spec(spec.model)
    tp = rollout.tp
    additional: dict[str, Any] = {CONFIG_KEY: {"model": model.to_dict()}}
    if worker_cls is not None and profiler_class_path:
        additional[profiling_worker.PROFILER_CONFIG_KEY] = {"class_path": profiler_class_path,
                                                             "rank_prefix": int(rank_prefix)}
    kw: dict[str, Any] = {
        "model": model_dir,
        "skip_tokenizer_init": True,
        "dtype": model.dtype,
        "enforce_eager": True,
        "max_model_len": model.max_position,
        "max_num_seqs": rollout.max_batch_size,
        "seed": spec.seed,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": rollout.pp,
        "enable_expert_parallel": rollout.ep > 1,
        "distributed_executor_backend": "uni" if tp == 1 else "mp",
        "enable_prefix_caching": False,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": EXTENSION_CLS,
        "additional_config": additional,
        "disable_log_stats": True,
    }
    if spec.platform.device == "cuda":
        kw.update(cuda_memory_kwargs())
    if worker_cls is not None:
        kw["worker_cls"] = worker_cls
    return kw


def cold_cache_env(directory: str) -> dict[str, str]:
    """Kernel and compile caches of a GPU engine under ``directory`` (fresh per run dir).

    The rollout profiler counts the operators of the engine-init window, and
    what vLLM runs there depends on whether Triton / FlashInfer / vLLM find
    their JIT caches warm: a capture on a fresh GPU machine and a check after
    it differed there, and only there (measured on the H200: cold-cache init
    ran ``randperm``, ``amax``, 400 more ``detach`` ... for kernel tuning).
    So every engine starts from empty caches of its own.
    """
    return {name: os.path.join(directory, sub) for name, sub in (
        ("TRITON_CACHE_DIR", "triton"), ("VLLM_CACHE_ROOT", "vllm"),
        ("FLASHINFER_WORKSPACE_BASE", "flashinfer"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"))}


GPU_MEMORY_UTILIZATION_ENV = "HARNESS_VLLM_GPU_MEMORY_UTILIZATION"
KV_CACHE_BYTES_ENV = "HARNESS_VLLM_KV_CACHE_BYTES"


def cuda_memory_kwargs() -> dict[str, Any]:
    """GPU memory of a vLLM engine colocated with the policy on the same GPU.

    ``gpu_memory_utilization`` (default 0.3, ``$HARNESS_VLLM_GPU_MEMORY_UTILIZATION``)
    bounds what vLLM may take of the device, leaving the rest to the policy
    process; ``kv_cache_memory_bytes`` (default 2 GiB, ``$HARNESS_VLLM_KV_CACHE_BYTES``)
    sizes the KV cache directly, so vLLM skips its memory-profiling pass at start.
    """
    return {
        "gpu_memory_utilization": float(os.environ.get(GPU_MEMORY_UTILIZATION_ENV, "0.3")),
        "kv_cache_memory_bytes": int(os.environ.get(KV_CACHE_BYTES_ENV, str(2 << 30))),
    }


def write_initial_model(spec: Workload, directory: str) -> str:
    """The step-0 weights (``initial_weights(spec)``) as an HF directory."""
    from harness.rollout.engine_worker import initial_weights, resolve_eos_token_id
    from harness.rollout.vllm.hf_dir import write_hf_dir

    return write_hf_dir(ModelConfig.from_spec(spec.model), directory, initial_weights(spec),
                        eos_token_id=resolve_eos_token_id(spec))


# -- the engine -------------------------------------------------------------------------------
class _LoopThread:
    """A private event loop in a daemon thread: AsyncLLM lives on it, callers block on results."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10.0)


class VllmEngine:
    """``vllm.LLM`` (sync) or ``AsyncLLM`` (async) with the harness's request/result format.

    Every public method is serialised by one lock (a refit never interleaves
    with a generation, as in the native engine).
    """

    def __init__(self, spec: Mapping[str, Any], model_dir: str, *, is_async: bool, in_process: bool,
                 worker_cls: str | None, profiler_class_path: str | None, rank_prefix: int) -> None:
        require_vllm()
        from harness.rollout.engine_worker import resolve_eos_token_id

        spec = as_workload(spec)
        os.environ.update(engine_env(spec, in_process=in_process))
        if spec.platform.device == "cuda":
            os.environ.update(cold_cache_env(os.path.join(os.path.dirname(os.path.abspath(model_dir)), "jit-cache")))
        self.model = ModelConfig.from_spec(spec.model)
        self.eos_token_id = resolve_eos_token_id(spec)
        self.is_async = is_async
        self.tp = spec.rollout.tp
        self._lock = threading.RLock()
        kw = engine_kwargs(spec, model_dir, worker_cls=worker_cls, profiler_class_path=profiler_class_path,
                           rank_prefix=rank_prefix)
        self._loop: _LoopThread | None = None
        if is_async:
            self._loop = _LoopThread("vllm-async-engine")

            async def build():
                from vllm.engine.arg_utils import AsyncEngineArgs
                from vllm.v1.engine.async_llm import AsyncLLM

                return AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))

            try:
                self.llm = self._loop.run(build())
            except BaseException:
                self._loop.stop()
                raise
        else:
            from vllm import LLM

            self.llm = LLM(**kw)

    # -- collective_rpc -----------------------------------------------------------------
    def rpc(self, method: str, kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """``collective_rpc(method, kwargs)``: one result per internal worker, in rank order."""
        with self._lock:
            if self._loop is not None:
                return self._loop.run(self.llm.collective_rpc(method, kwargs=dict(kwargs or {})))
            return self.llm.collective_rpc(method, kwargs=dict(kwargs or {}))

    # -- generation -----------------------------------------------------------------------
    def generate(self, requests: Sequence[Mapping[str, Any]], weight_version: int) -> list[dict]:
        """Results in request order (``translate.result_of``)."""
        from vllm import SamplingParams

        translate.check_requests(requests, vocab=self.model.vocab, max_position=self.model.max_position)
        results: list[dict | None] = [None] * len(requests)
        todo: list[tuple[int, Mapping[str, Any], Any]] = []
        for i, request in enumerate(requests):
            kw = translate.sampling_kwargs(request, eos_token_id=self.eos_token_id,
                                           max_position=self.model.max_position)
            if kw["max_tokens"] <= 0:
                results[i] = translate.empty_result(request, weight_version=weight_version)
            else:
                todo.append((i, request, SamplingParams(**kw)))
        with self._lock:
            if self._loop is not None:
                outputs = self._loop.run(self._generate_async(todo))
            elif todo:
                outputs = self.llm.generate([translate.prompt_of(r) for _, r, _ in todo],
                                            [sp for _, _, sp in todo], use_tqdm=False)
            else:
                outputs = []
        for (i, request, _), output in zip(todo, outputs):
            results[i] = translate.result_of(request, output.outputs[0], eos_token_id=self.eos_token_id,
                                             weight_version=weight_version)
        return results  # type: ignore[return-value]

    async def _generate_async(self, todo: list) -> list:
        """Submit the whole batch, then collect every request's final output.

        The scheduler is paused (``mode="keep"``: new requests are queued, none
        is scheduled) while the batch is added and resumed once all of it is
        queued, so every request enters the same first step. Without that the
        engine core starts stepping on the first arrivals, the batch
        composition depends on timing, and on a GPU the sampled-token logprobs
        (and the rollout window's operator counts) differed between reruns
        (measured on the H200: same tokens, different low bits). A build
        without ``pause_generation`` streams the requests as they are added.
        """
        pause = getattr(self.llm, "pause_generation", None)
        queues = []
        if pause is not None:
            await pause(mode="keep", clear_cache=False)
        try:
            for _, request, params in todo:
                rid = f"{request['request_id']}#{next(_ids)}"
                queues.append((request, await self.llm.add_request(rid, translate.prompt_of(request), params)))
        finally:
            if pause is not None:
                await self.llm.resume_generation()

        async def final_of(request, queue):
            out = None
            while out is None or not out.finished:
                out = queue.get_nowait() or await queue.get()
            if out is None or not out.finished:
                raise RuntimeError(f"vLLM async engine returned no final output for request {request['request_id']!r}")
            return out

        return list(await asyncio.gather(*(final_of(r, q) for r, q in queues)))

    # -- shutdown ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the engine (and its processes); idempotent."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        try:
            if self._loop is not None:
                async def close() -> None:  # shut down on the engine's loop, then end its tasks
                    llm.shutdown()
                    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)

                self._loop.run(close())
            else:
                engine = getattr(llm, "llm_engine", None)
                core = getattr(engine, "engine_core", None)
                if core is not None and hasattr(core, "shutdown"):
                    core.shutdown()
        finally:
            if self._loop is not None:
                self._loop.stop()


# -- in-actor owner (sync, TP = 1) --------------------------------------------------------------
class VllmEngineWorker(RolloutLifecycleRPC):
    """Sync TP=1 vLLM engine in the actor process, with the ``EngineWorker`` surface."""

    def __init__(self, spec: Mapping[str, Any], *, profiler_rank: int, work_dir: str,
                 profiler_class_path: str | None) -> None:
        from harness.plugins.loader import load_rollout_profiler
        from harness.plugins.rollout_hooks import RolloutProfilerHooks

        spec = as_workload(spec)
        worker_cls = resolve_worker_cls(spec, profiler_class_path)  # refuses custom classes
        require_vllm()
        self.spec = spec
        self.hooks = RolloutProfilerHooks(load_rollout_profiler(rank=profiler_rank))
        with self.hooks.engine_init_or_close("vLLM engine"):
            model_dir = write_initial_model(spec, os.path.join(work_dir, "model"))
            self.engine = VllmEngine(spec, model_dir, is_async=False, in_process=True, worker_cls=worker_cls,
                                     profiler_class_path=None, rank_prefix=profiler_rank)
            self.engine.generate([WARMUP_REQUEST], 0)

    # lifecycle: RolloutLifecycleRPC
    def engine_pids(self) -> list[int]:
        return list(self.engine.rpc("harness_pid"))

    # generation and weights
    def generate(self, requests: list[dict]) -> list[dict]:
        return self.engine.generate(requests, self.weight_version())

    def weight_version(self) -> int:
        return int(self.engine.rpc("harness_weight_version")[0])

    def set_weight_version(self, version: int) -> int:
        return int(self.engine.rpc("harness_set_weight_version", {"version": int(version)})[0])

    def state_dict_info(self) -> dict:
        return state_dict_info(self.engine.model)

    def state_dict(self) -> dict:
        return unpack_state(self.engine.rpc("harness_state_dict")[0])

    def receive_weights_zmq(self, *, address: str, timeout_ms: int) -> int:
        return int(self.engine.rpc("harness_receive_weights_zmq",
                                   {"per_rank": [{"address": address, "timeout_ms": int(timeout_ms)}]})[0])

    def receive_weights_broadcast(self, **kw: Any) -> int:
        return int(self.engine.rpc("harness_receive_weights_broadcast", {"per_rank": [dict(kw)]})[0])

    def side_groups(self) -> list[dict]:
        if self.engine.llm is None:
            return []
        return list(self.engine.rpc("harness_side_groups")[0])

    def close_side_groups(self) -> None:
        if self.engine.llm is not None:
            self.engine.rpc("harness_close_side_groups")

    def shutdown_engine(self) -> None:
        self.engine.shutdown()


# -- internal-worker owner (TP > 1 or async) --------------------------------------------------------
_LIFECYCLE = {
    "end_engine_initialization": "end_rollout_profiler_engine_initialization",
    "begin_rollout": "begin_rollout_profile",
    "finish_rollout": "finish_rollout_profile",
    "abort_rollout": "abort_rollout_profile",
    "close_profiler": "close_rollout_profiler",
}
_WEIGHTS = {
    "weight_version": "harness_weight_version",
    "set_weight_version": "harness_set_weight_version",
    "close_side_groups": "harness_close_side_groups",
    "side_groups": "harness_side_groups",
    "pid": "harness_pid",
}
_ARG_NAMES = {
    "generate": ("requests",),
    "begin_rollout": ("step_id",),
    "abort_rollout": ("reason",),
    "set_weight_version": ("version",),
}


class VllmEngineProcesses:
    """vLLM with its own worker processes, with the ``EngineProcesses`` surface."""

    def __init__(self, engine: VllmEngine, label: str, profiled: bool) -> None:
        self.engine = engine
        self.label = label
        self.profiled = profiled
        self.pids = list(engine.rpc("harness_pid"))

    @classmethod
    def start(cls, spec: Mapping[str, Any], *, rank_prefix: int, label: str, work_dir: str,
              profiler_class_path: str | None) -> VllmEngineProcesses:
        """Create the engine (workers open their init windows in their constructors) and warm it up."""
        spec = as_workload(spec)
        worker_cls = resolve_worker_cls(spec, profiler_class_path)  # refuses custom classes
        require_vllm()
        model_dir = write_initial_model(spec, os.path.join(work_dir, "model"))
        engine = VllmEngine(spec, model_dir, is_async=spec.rollout.is_async, in_process=False,
                            worker_cls=worker_cls, profiler_class_path=profiler_class_path, rank_prefix=rank_prefix)
        try:
            engine.generate([WARMUP_REQUEST], 0)
            return cls(engine, label, profiled=bool(profiler_class_path) and worker_cls is not None)
        except BaseException:
            engine.shutdown()
            raise

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method`` on every internal worker (``collective_rpc``); one result per rank."""
        if self.engine.llm is None:
            raise RuntimeError(f"{self.label} is stopped")
        names = _ARG_NAMES.get(method, ())
        if len(args) > len(names):
            raise TypeError(f"{self.label}: {method} takes at most {len(names)} positional argument(s)")
        kwargs = {**dict(zip(names, args)), **kwargs}
        if method == "generate":
            (requests,) = kwargs.values()
            version = int(self.engine.rpc("harness_weight_version")[0])
            return [self.engine.generate(requests, version)] * self.engine.tp
        if method == "state_dict":  # bytes per rank: tensors do not survive vLLM's RPC codec
            return [unpack_state(b) for b in self.engine.rpc("harness_state_dict")]
        if method == "state_dict_info":  # a function of the model block, the same on every rank
            return [state_dict_info(self.engine.model) for _ in range(self.engine.tp)]
        if method in _LIFECYCLE:
            if not self.profiled:
                return [None] * self.engine.tp
            return self.engine.rpc(_LIFECYCLE[method], kwargs)
        if method in _WEIGHTS:
            return self.engine.rpc(_WEIGHTS[method], kwargs)
        raise AttributeError(f"{self.label}: no engine method {method!r}")

    def call_each(self, method: str, per_rank_kwargs: Sequence[Mapping[str, Any]]) -> list[Any]:
        """A refit: every worker takes its own kwargs (``per_rank[rank]``)."""
        if len(per_rank_kwargs) != self.engine.tp:
            raise ValueError(f"{method}: {len(per_rank_kwargs)} kwarg sets for {self.engine.tp} ranks")
        target = {"receive_weights_zmq": "harness_receive_weights_zmq",
                  "receive_weights_broadcast": "harness_receive_weights_broadcast"}.get(method)
        if target is None:
            raise AttributeError(f"{self.label}: no per-rank engine method {method!r}")
        return self.engine.rpc(target, {"per_rank": [dict(kw) for kw in per_rank_kwargs]})

    def stop(self) -> None:
        self.engine.shutdown()
