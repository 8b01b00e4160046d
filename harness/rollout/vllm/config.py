"""How a vLLM rollout engine is configured from the spec (``rollout.backend: vllm``).

Pure functions of the spec and the environment, importable without vLLM:
the worker class (``resolve_worker_cls``: a custom ``rollout.worker_cls`` is
refused), the environment vLLM reads at creation (``engine_env``; on cuda
``VLLM_HOST_IP`` defaults to loopback), the ``vllm.LLM`` / ``AsyncEngineArgs``
keyword arguments (``engine_kwargs``: fp32, ``enforce_eager``, prefix caching
off, the worker extension), the GPU engine's cold JIT caches
(``cold_cache_env``) and memory share (``cuda_memory_kwargs``), and the step-0
weights as an HF directory (``write_initial_model``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from harness.model.config import ModelConfig
from harness.rollout.vllm import profiling_worker
from harness.rollout.vllm.extension import CONFIG_KEY
from harness.spec.typed import Workload, as_workload

EXTENSION_CLS = "harness.rollout.vllm.extension.HarnessVllmWorkerExtension"

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
