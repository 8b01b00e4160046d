"""The cuda-only parts of the vLLM backend and the refit driver, checked without vLLM or a GPU.

What runs the official build on a GPU (suites/vllm_backend needs vLLM; the
GPU runs are ``benches/vllm_gpu_bench.py`` and the ``qwen3_moe_medium_vllm``
golden): here the engine arguments and environment per device, the GPU
worker's refit load path (one ``reload_weights`` with the experts, no CPU
repack) and the refit driver's staging choice. The vLLM worker is a test
double here (a namespace with the attributes the extension reads), since
vLLM is not installed in this tier.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.grpo.refitter import Refitter
from harness.rollout.vllm import engine
from harness.rollout.vllm.extension import CONFIG_KEY, HarnessVllmWorkerExtension
from harness.spec.load import load_spec


@pytest.fixture(scope="module")
def medium():
    return load_spec("qwen3_moe_medium_vllm")


def _on(spec, device):
    return dict(spec, platform=dict(spec["platform"], device=device))


def test_cuda_engine_gets_a_bounded_gpu_share_and_cpu_is_unchanged(medium, monkeypatch):
    monkeypatch.delenv(engine.GPU_MEMORY_UTILIZATION_ENV, raising=False)
    monkeypatch.delenv(engine.KV_CACHE_BYTES_ENV, raising=False)
    kw = engine.engine_kwargs(_on(medium, "cuda"), "/m", worker_cls=None, profiler_class_path=None, rank_prefix=0)
    assert kw["gpu_memory_utilization"] == 0.3 and kw["kv_cache_memory_bytes"] == 2 << 30
    cpu = engine.engine_kwargs(_on(medium, "cpu"), "/m", worker_cls=None, profiler_class_path=None, rank_prefix=0)
    assert "gpu_memory_utilization" not in cpu and "kv_cache_memory_bytes" not in cpu
    assert {k: v for k, v in kw.items() if k not in ("gpu_memory_utilization", "kv_cache_memory_bytes")} == cpu
    monkeypatch.setenv(engine.KV_CACHE_BYTES_ENV, "1048576")
    assert engine.cuda_memory_kwargs()["kv_cache_memory_bytes"] == 1 << 20


def test_cuda_engine_env_defaults_to_loopback(medium, monkeypatch):
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    assert engine.engine_env(_on(medium, "cuda"), in_process=False)["VLLM_HOST_IP"] == "127.0.0.1"
    assert "VLLM_HOST_IP" not in engine.engine_env(_on(medium, "cpu"), in_process=False)
    monkeypatch.setenv("VLLM_HOST_IP", "10.0.0.7")
    assert engine.engine_env(_on(medium, "cuda"), in_process=True)["VLLM_HOST_IP"] == "10.0.0.7"


def test_async_profiled_cuda_engine_uses_the_gpu_profiling_worker(medium):
    path = engine.resolve_worker_cls(medium, "harness.profiler.trace.TraceRolloutProfiler")
    assert path == "harness.rollout.vllm.profiling_worker.RolloutProfilingGPUWorker"


class _Worker(HarnessVllmWorkerExtension):
    """A vLLM worker double: the attributes the extension reads, and recorded calls."""

    def __init__(self, device: str, model: dict, tp: int = 1, rank: int = 0):
        self.device = torch.device(device)
        self.rank = rank
        self.vllm_config = SimpleNamespace(additional_config={CONFIG_KEY: {"model": model}},
                                           parallel_config=SimpleNamespace(tensor_parallel_size=tp))
        self.reloaded: list[list[str]] = []
        self.repacked = 0

    def reload_weights(self, weights_iterator, is_checkpoint_format):
        assert is_checkpoint_format
        self.reloaded.append([name for name, _ in weights_iterator])

    def _harness_repack_experts(self, received):
        self.repacked += 1
        return 0


def _received():
    return {"model.embed_tokens.weight": torch.zeros(2), "model.layers.0.mlp.gate.weight": torch.zeros(2),
            "model.layers.0.mlp.experts.0.up_proj.weight": torch.zeros(2)}


@pytest.mark.parametrize("device, reloaded, repacked", [
    ("cuda", ["model.embed_tokens.weight", "model.layers.0.mlp.gate.weight",
              "model.layers.0.mlp.experts.0.up_proj.weight"], 0),
    ("cpu", ["model.embed_tokens.weight", "model.layers.0.mlp.gate.weight"], 1),
])
def test_refit_load_path_per_device(medium, device, reloaded, repacked):
    worker = _Worker(device, medium["model"])
    received = _received()
    assert worker._harness_load(received) == 1
    assert worker.reloaded == [reloaded]
    assert worker.repacked == repacked
    assert sorted(worker._harness_loaded) == sorted(_received()) and received == {}


def test_zmq_keeper_copies_onto_the_workers_own_device(medium, monkeypatch):
    """CPU worker: each view cloned (as before). A device worker: one ``_foreach_copy_`` per
    group onto *its* device, whatever device the staging views are on (TP > 1: rank 0's GPU).
    The second device is ``meta`` here (no GPU on this box): placement, shapes and dtypes."""
    views = [("a", torch.arange(6.0).reshape(2, 3)), ("b", torch.ones(4, dtype=torch.bfloat16))]
    calls = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda dst, src: (calls.append(len(dst)), real(dst, src)))
    received: dict = {}
    _Worker("cpu", medium["model"])._harness_keeper(received)(views)
    assert calls == [] and all(torch.equal(received[n], v) for n, v in views)
    assert all(received[n].data_ptr() != v.data_ptr() for n, v in views)  # copies, not the staging views
    on_device: dict = {}
    _Worker("meta", medium["model"])._harness_keeper(on_device)(views)
    assert calls == [2]
    assert {n: (t.device.type, tuple(t.shape), t.dtype) for n, t in on_device.items()} == {
        "a": ("meta", (2, 3), torch.float32), "b": ("meta", (4,), torch.bfloat16)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (L2: ci/l2.sh on a GPU machine)")
def test_zmq_keeper_on_a_gpu_worker_copies_bit_for_bit(medium):
    views = [("a", torch.randn(3, 5, device="cuda")), ("b", torch.randn(7, device="cuda").to(torch.bfloat16))]
    received: dict = {}
    _Worker("cuda", medium["model"])._harness_keeper(received)(views)
    for name, view in views:
        assert torch.equal(received[name], view) and received[name].data_ptr() != view.data_ptr()


def test_refitter_stages_on_the_gpu_only_on_cuda(medium, monkeypatch):
    monkeypatch.delenv("HARNESS_REFIT_STAGING", raising=False)
    assert Refitter(_on(medium, "cuda"), None, [], run_dir=None).zmq_extra == {"staging_device": "cuda"}
    assert Refitter(_on(medium, "cpu"), None, [], run_dir=None).zmq_extra == {}
    monkeypatch.setenv("HARNESS_REFIT_STAGING", "host")
    assert Refitter(_on(medium, "cuda"), None, [], run_dir=None).zmq_extra == {}


def test_cuda_engine_starts_from_fresh_kernel_caches_under_its_work_dir(tmp_path):
    env = engine.cold_cache_env(str(tmp_path / "jit-cache"))
    assert set(env) == {"TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE", "TORCHINDUCTOR_CACHE_DIR"}
    assert all(v.startswith(str(tmp_path / "jit-cache")) for v in env.values())
    assert len(set(env.values())) == 4


def test_tp2_on_cuda_uses_gpu_workers_in_processes_and_keeps_each_ranks_shards(medium):
    """TP > 1 on GPUs (not run here: one-GPU machines only): the engine arguments and the
    refit load of one worker of two, with the real shard plan of the tiny vLLM model."""
    from harness.model.config import ModelConfig
    from harness.rollout.engine_worker import initial_weights
    from harness.rollout.sharding import ShardPlan

    spec = _on(dict(medium, rollout=dict(medium["rollout"], tp=2, **{"async": False})), "cuda")
    worker_cls = engine.resolve_worker_cls(spec, "harness.profiler.trace.TraceRolloutProfiler")
    assert worker_cls.endswith("RolloutProfilingGPUWorker")
    kw = engine.engine_kwargs(spec, "/m", worker_cls=worker_cls, profiler_class_path="p", rank_prefix=4)
    assert kw["distributed_executor_backend"] == "mp" and kw["tensor_parallel_size"] == 2
    assert kw["additional_config"]["harness_rollout_profiler"] == {"class_path": "p", "rank_prefix": 4}
    assert "gpu_memory_utilization" in kw
    tiny = load_spec("qwen3_moe_tiny_vllm")
    full = initial_weights(tiny)
    worker = _Worker("cuda", tiny["model"], tp=2, rank=1)
    worker._harness_load(dict(full))
    assert worker.reloaded == [list(full)] and worker.repacked == 0
    plan = ShardPlan(ModelConfig.from_spec(tiny["model"]), 1, 2)
    for name, t in full.items():
        assert torch.equal(worker._harness_loaded[name], plan.shard(name, t)), name
    assert any(worker._harness_loaded[n].shape != t.shape for n, t in full.items())  # something was split
