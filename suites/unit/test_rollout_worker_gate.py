"""RolloutWorker start-up gates run before any engine exists (no Ray needed)."""

from __future__ import annotations

import pytest

from harness.rollout.worker import RolloutWorker
from harness.spec.typed import as_workload

MODEL = dict(layers=1, hidden=16, heads=2, kv_heads=1, head_dim=8, experts=2, top_k=1,
             moe_intermediate=8, vocab=32, max_position=32)


def _spec(**rollout):
    base = {"backend": "native", "tp": 1, "pp": 1, "ep": 1, "async": False, "max_batch_size": 2, "worker_cls": None}
    base.update(rollout)
    return as_workload({"seed": 1, "model": MODEL, "rollout": base, "platform": {"device": "cpu"}})


def test_custom_worker_cls_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="rollout.worker_cls 'my.Worker'"):
        RolloutWorker(_spec(worker_cls="my.Worker"), 0, 0, str(tmp_path))


@pytest.mark.parametrize("field", ["pp", "ep"])
def test_profiler_topology_gate(tmp_path, monkeypatch, field):
    monkeypatch.setenv("NRL_ROLLOUT_PROFILER_CLASS", "")  # restored after the worker writes env_vars
    env = {"NRL_ROLLOUT_PROFILER_CLASS": "harness.profiler.trace.TraceRolloutProfiler"}
    with pytest.raises(ValueError, match=f"rollout.{field} must be 1"):
        RolloutWorker(_spec(**{field: 2}), 0, 0, str(tmp_path), env_vars=env)


def test_in_actor_engine_without_profiler(tmp_path, monkeypatch):
    monkeypatch.setenv("NRL_ROLLOUT_PROFILER_CLASS", "")
    monkeypatch.setenv("RANK", "0")
    worker = RolloutWorker(_spec(), 0, 0, str(tmp_path))
    try:
        assert worker.ready()["engine_pids"] == [] and worker.weight_version() == 0
        assert len(worker.refit_addresses()) == 1
    finally:
        worker.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        worker.weight_version()
