"""Built-in trace profilers in one process: records, phases, tokens, close, determinism."""

from __future__ import annotations

import pytest
import torch

from harness.artifacts.layout import policy_trace_path, rollout_trace_path
from harness.artifacts.trace import read_trace
from harness.plugins.loader import load_policy_profiler, load_rollout_profiler
from harness.plugins.policy_hooks import PolicyProfilerHooks
from harness.plugins.rollout_hooks import RolloutProfilerHooks
from suites.tiny_train import tiny_train
from suites.torch_state import torch_settings

POLICY = "harness.profiler.trace.TracePolicyProfiler"
ROLLOUT = "harness.profiler.trace.TraceRolloutProfiler"


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_settings(threads=1, deterministic=True):
        yield


def _run_policy(monkeypatch, run_dir, steps=2, rank=0, trace_dir=None):
    env = {"NRL_POLICY_PROFILER_CLASS": POLICY}
    monkeypatch.setenv("HARNESS_TRACE_DIR", str(trace_dir or run_dir))
    monkeypatch.setenv("HARNESS_RUN_ID", "unit")
    hooks = PolicyProfilerHooks(load_policy_profiler(rank=rank, environ=env))
    for _ in range(steps):
        hooks.run_train(tiny_train, torch.ones(4, 8))
    hooks.run_train(tiny_train, torch.ones(4, 8), None, True)  # eval: not profiled
    hooks.close()
    return read_trace(run_dir / policy_trace_path(rank))


def _fields(trace):
    return [
        {k: v for k, v in r.items() if k not in ("memory", "wall_s", "crc")}
        for r in trace.records
    ]


def test_policy_trace_records_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TRACE_DIR", str(tmp_path))
    trace = _run_policy(monkeypatch, tmp_path)
    assert trace.complete, trace.problems
    assert trace.header["role"] == "policy" and trace.header["run_id"] == "unit"
    assert trace.header["profiler"] == POLICY
    phases = trace.of_type("phase")
    assert [p["phase"] for p in phases] == ["train/step1", "train/step2"]
    assert all(p["outcome"] == "finished" for p in phases)
    ops = phases[1]["operators"]
    assert ops["aten::mm"] >= 1 and "aten::relu" in ops
    assert phases[1]["collectives"] == []  # no process group in this process
    assert phases[1]["memory"]["peak_rss"] > 0
    events = [(e["event"], e["phase"]) for e in trace.of_type("event")]
    assert events == [
        ("begin_train_step", "train/step1"), ("finish_train_step", "train/step1"),
        ("begin_train_step", "train/step2"), ("finish_train_step", "train/step2"),
    ]


def test_policy_trace_is_identical_across_reruns(tmp_path, monkeypatch):
    _run_policy(monkeypatch, tmp_path / "warmup")
    first = _run_policy(monkeypatch, tmp_path / "a")
    second = _run_policy(monkeypatch, tmp_path / "b")
    assert _fields(first) == _fields(second)


def test_trace_dir_may_be_the_artifacts_dir(tmp_path, monkeypatch):
    trace = _run_policy(monkeypatch, tmp_path, steps=1, rank=4, trace_dir=tmp_path / "artifacts")
    assert trace.complete
    assert (tmp_path / policy_trace_path(4)).is_file()


def test_missing_trace_dir_fails_worker_start(monkeypatch):
    monkeypatch.delenv("HARNESS_TRACE_DIR", raising=False)
    with pytest.raises(RuntimeError, match="Failed to initialize policy profiler .* rank 0") as info:
        load_policy_profiler(rank=0, environ={"NRL_POLICY_PROFILER_CLASS": POLICY})
    assert "HARNESS_TRACE_DIR" in str(info.value.__cause__)


def test_rollout_trace_phases_tokens_and_aborts(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TRACE_DIR", str(tmp_path))
    profiler = load_rollout_profiler(rank=1, environ={"NRL_ROLLOUT_PROFILER_CLASS": ROLLOUT})
    with pytest.raises(ValueError, match="not the token"):
        profiler.end_engine_initialization(object())
    hooks = RolloutProfilerHooks(profiler)
    with hooks.engine_init():
        torch.zeros(16).add_(1)
    with hooks.rollout("step1/attempt1"):
        torch.ones(3).softmax(0)
    with pytest.raises(KeyError, match="boom"), hooks.rollout("step1/attempt2"):
        raise KeyError("boom")
    hooks.close()
    trace = read_trace(tmp_path / rollout_trace_path(1))
    assert trace.complete, trace.problems
    phases = [(p["phase"], p["outcome"], p.get("reason")) for p in trace.of_type("phase")]
    assert phases == [
        ("engine_init", "finished", None),
        ("rollout/step1/attempt1", "finished", None),
        ("rollout/step1/attempt2", "aborted", "grpo_rollout_error"),
    ]
    assert "aten::_softmax" in trace.of_type("phase")[1]["operators"]


def test_close_with_open_phase_records_abort(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TRACE_DIR", str(tmp_path))
    profiler = load_policy_profiler(rank=0, environ={"NRL_POLICY_PROFILER_CLASS": POLICY})
    profiler.begin_train_step()
    profiler.close()
    profiler.close()  # idempotent
    trace = read_trace(tmp_path / policy_trace_path(0))
    assert trace.complete
    (phase,) = trace.of_type("phase")
    assert phase["outcome"] == "aborted" and phase["reason"] == "profiler_closed"


def _concurrent_phases(tmp_path):
    policy = load_policy_profiler(rank=0, environ={"NRL_POLICY_PROFILER_CLASS": POLICY})
    rollout = load_rollout_profiler(rank=0, environ={"NRL_ROLLOUT_PROFILER_CLASS": ROLLOUT})
    policy.begin_train_step()
    torch.ones(4).mul(2)
    token = rollout.begin_engine_initialization()
    torch.zeros(3).add_(1)
    rollout.end_engine_initialization(token)
    policy.finish_train_step()
    policy.close()
    rollout.close()
    (rphase,) = read_trace(tmp_path / rollout_trace_path(0)).of_type("phase")
    (pphase,) = read_trace(tmp_path / policy_trace_path(0)).of_type("phase")
    return pphase, rphase


def test_second_concurrent_profiler_reports_instead_of_failing(tmp_path, monkeypatch):
    """torch.profiler is one session per process: the nested phase reports, it does not fail."""
    monkeypatch.setenv("HARNESS_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("HARNESS_TRACE_OPERATORS", "profiler")
    pphase, rphase = _concurrent_phases(tmp_path)
    assert rphase["operators"] is None and "already in use" in rphase["problems"][0]
    # the outer window still counts everything run inside it, the nested phase's ops included
    assert pphase["operators"]["aten::mul"] == 1 and pphase["operators"]["aten::add_"] == 1


def test_concurrent_phases_both_count_with_recordfn(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TRACE_DIR", str(tmp_path))
    monkeypatch.delenv("HARNESS_TRACE_OPERATORS", raising=False)
    if not _recordfn_available():
        pytest.skip("C++ operator counter unavailable (no compiler)")
    pphase, rphase = _concurrent_phases(tmp_path)
    assert "problems" not in pphase and "problems" not in rphase
    assert rphase["operators"]["aten::add_"] == 1 and "aten::mul" not in rphase["operators"]
    # the outer window sees everything the nested one saw, and its own ops
    assert pphase["operators"]["aten::add_"] == 1 and pphase["operators"]["aten::mul"] == 1


# -- operator sources ------------------------------------------------------------------


def _recordfn_available() -> bool:
    from harness.profiler import opcount

    try:
        opcount.load()
    except opcount.OpCountUnavailable:
        return False
    return True


def _adamw_steps(steps=2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(5, 8)

    def train(data_, loss_fn=None, eval_mode=False):
        opt.zero_grad(set_to_none=True)
        with torch.profiler.record_function("user_scope"):
            loss = model(data_).softmax(-1).pow(2).mean()
        loss.backward()
        opt.step()
        return float(loss.detach())

    return train, data


def _run_source(monkeypatch, run_dir, source):
    monkeypatch.setenv("HARNESS_TRACE_DIR", str(run_dir))
    monkeypatch.setenv("HARNESS_TRACE_OPERATORS", source)
    hooks = PolicyProfilerHooks(load_policy_profiler(rank=0, environ={"NRL_POLICY_PROFILER_CLASS": POLICY}))
    train, data = _adamw_steps()
    for _ in range(3):
        hooks.run_train(train, data)
    hooks.close()
    return read_trace(run_dir / policy_trace_path(0))


def test_recordfn_and_profiler_sources_give_the_same_inventory(tmp_path, monkeypatch):
    if not _recordfn_available():
        pytest.skip("C++ operator counter unavailable (no compiler)")
    fast = _run_source(monkeypatch, tmp_path / "recordfn", "recordfn")
    slow = _run_source(monkeypatch, tmp_path / "profiler", "profiler")
    assert fast.header["operator_source"] == "recordfn" and slow.header["operator_source"] == "profiler"
    fast_ops = [p["operators"] for p in fast.of_type("phase")]
    slow_ops = [p["operators"] for p in slow.of_type("phase")]
    assert fast_ops == slow_ops
    ops = fast_ops[-1]
    # forward, backward (autograd engine events), optimizer and user scopes are all there
    assert ops["aten::addmm"] == 2 and ops["user_scope"] == 1
    assert any(name.startswith("autograd::engine::evaluate_function: AddmmBackward0") for name in ops)
    assert any(name.startswith("Optimizer.step#AdamW.step") for name in ops)
    # utility events dropped like torch.profiler's own aggregation does
    assert not any(name.startswith("profiler::_record_function") for name in ops)


def test_operators_off(tmp_path, monkeypatch):
    trace = _run_source(monkeypatch, tmp_path, "off")
    assert trace.complete and trace.header["operator_source"] == "off"
    for phase in trace.of_type("phase"):
        assert phase["operators"] is None and "problems" not in phase


def test_unknown_operator_source_fails_worker_start(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("HARNESS_TRACE_OPERATORS", "kineto")
    with pytest.raises(RuntimeError, match="Failed to initialize policy profiler") as info:
        load_policy_profiler(rank=0, environ={"NRL_POLICY_PROFILER_CLASS": POLICY})
    assert "HARNESS_TRACE_OPERATORS" in str(info.value.__cause__)


def test_recordfn_falls_back_to_profiler_without_a_compiler(tmp_path, monkeypatch):
    from harness.profiler import opcount

    monkeypatch.setattr(opcount, "_lib", None)
    monkeypatch.setattr(opcount, "_lib_error", None)
    monkeypatch.setenv("HARNESS_TRACE_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    trace = _run_source(monkeypatch, tmp_path / "run", "recordfn")
    assert trace.complete, trace.problems
    assert trace.header["operator_source"] == "profiler"
    assert "recordfn unavailable" in trace.header["probe_notes"][0]
    assert trace.of_type("phase")[-1]["operators"]["aten::addmm"] == 2


def test_recordfn_build_is_cached_and_reused(tmp_path, monkeypatch):
    from harness.profiler import opcount

    if not _recordfn_available():
        pytest.skip("C++ operator counter unavailable (no compiler)")
    cxx = opcount._compiler()
    target = opcount.library_path(cxx)
    assert target.is_file() and target.parent == opcount.build_dir()
    assert not list(target.parent.glob(f"{target.stem}.*.tmp"))  # published by rename, no leftovers
    # reused: a fresh load (as in a new process) takes the published library; a rebuild would
    # publish a new file (os.replace: a new inode)
    built = target.stat()
    monkeypatch.setattr(opcount, "_lib", None)
    monkeypatch.setattr(opcount, "_lib_error", None)
    assert opcount.load().harness_opcount_abi_version() == opcount.ABI_VERSION
    assert (target.stat().st_ino, target.stat().st_mtime_ns) == (built.st_ino, built.st_mtime_ns)


def test_recordfn_stop_on_another_thread_is_reported(tmp_path, monkeypatch):
    import threading

    from harness.profiler import opcount

    if not _recordfn_available():
        pytest.skip("C++ operator counter unavailable (no compiler)")
    counter = opcount.RecordFunctionCounter()
    counter.start()
    torch.ones(2).neg()
    out = {}
    thread = threading.Thread(target=lambda: out.update(result=counter.stop()))
    thread.start()
    thread.join()
    counts, problem = out["result"]
    assert counts.get("aten::neg") == 1 and "different thread" in problem
    torch.ones(2).neg()  # the inert callback left on this thread counts nowhere
    again = opcount.RecordFunctionCounter()
    again.start()
    torch.ones(2).neg()
    counts, problem = again.stop()
    assert counts["aten::neg"] == 1 and problem is None


def test_collective_recorder_state_survives_many_windows_and_gc():
    """The recorder's thread-local state keeps exactly the references it should.

    torch 2.11's TLS stash takes over the caller's reference instead of taking
    its own (the active tuple was freed while stashed and its memory reused by
    a Tensor, on the H200 box); ``collectives._stash`` compensates per torch,
    measured once. Whatever this torch does, after many windows and a
    collection the stashed tuple must still be the live recorder tuple.
    """
    import gc
    import sys

    from harness.profiler import collectives

    assert isinstance(collectives._stash_steals_reference(), bool)
    for _ in range(100):
        recorder = collectives.KernelCollectiveRecorder()
        recorder.start()
        active = collectives._active_recorders()
        gc.collect()
        assert active == (recorder,) and collectives._active_recorders() is active
        assert sys.getrefcount(active) >= 3  # ours, getrefcount's argument, the stash's
        assert recorder.stop() == []
        assert collectives._active_recorders() == ()
    gc.collect()
    assert collectives._active_recorders() == ()


def test_recordfn_counts_names_whose_storage_is_reused(tmp_path, monkeypatch):
    """User-scope names live in per-call storage that later calls reuse for other names.

    The counter caches entries by name pointer; this checks that a reused pointer
    holding a different name is still counted under its own text.
    """
    if not _recordfn_available():
        pytest.skip("C++ operator counter unavailable (no compiler)")
    from harness.profiler.opcount import RecordFunctionCounter

    counter = RecordFunctionCounter()
    counter.start()
    for i in range(700):
        with torch.profiler.record_function("".join(["scope-", str(i % 7), "-", "x" * (i % 3)])):
            pass
    counts, problem = counter.stop()
    assert problem is None
    expected: dict[str, int] = {}
    for i in range(700):
        name = f"scope-{i % 7}-{'x' * (i % 3)}"
        expected[name] = expected.get(name, 0) + 1
    assert {k: v for k, v in counts.items() if k.startswith("scope-")} == expected
