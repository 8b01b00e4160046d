"""Rollout lifecycle driver, topology gate, worker-class gate and rank mapping."""

from __future__ import annotations

import pytest

from harness.plugins.recording import InjectedFailure, RecordingRolloutProfiler
from harness.plugins.rollout_hooks import (
    SUPPORTED_ENGINE_WORKER_CLASSES,
    RolloutProfilerHooks,
    outer_rollout_rank,
    rollout_profiler_class_path,
    rollout_profiler_rank,
    validate_engine_worker_cls,
    validate_rollout_profiler_topology,
)


def _ready(prof=None):
    prof = prof or RecordingRolloutProfiler()
    hooks = RolloutProfilerHooks(prof)
    with hooks.engine_init():
        pass
    return prof, hooks


def test_engine_init_passes_back_the_exact_token():
    prof, _hooks = _ready()
    assert prof.names() == ["begin_init", "end_init"]
    assert prof.calls[1][1] is prof.token


def test_engine_init_failure_still_ends_window_then_reraises():
    prof = RecordingRolloutProfiler()
    hooks = RolloutProfilerHooks(prof)
    with pytest.raises(ValueError, match="engine exploded"), hooks.engine_init():
        raise ValueError("engine exploded")
    assert prof.names() == ["begin_init", "end_init"] and prof.calls[1][1] is prof.token


def test_engine_init_end_failure_is_a_note_on_the_engine_error():
    hooks = RolloutProfilerHooks(RecordingRolloutProfiler(fail={"end_init": 0}))
    with pytest.raises(ValueError, match="engine exploded") as info, hooks.engine_init():
        raise ValueError("engine exploded")
    assert any("end_engine_initialization also failed" in n for n in info.value.__notes__)


def test_engine_init_or_close_keeps_the_window_open_on_success():
    prof = RecordingRolloutProfiler()
    hooks = RolloutProfilerHooks(prof)
    with hooks.engine_init_or_close("engine"):
        pass
    assert hooks.init_open and prof.names() == ["begin_init"]  # the owner ends it after every engine warmed up
    hooks.end_engine_init()
    assert prof.names() == ["begin_init", "end_init"]


def test_engine_init_or_close_closes_on_failure_and_notes_a_close_failure():
    prof = RecordingRolloutProfiler()
    hooks = RolloutProfilerHooks(prof)
    with pytest.raises(ValueError, match="engine exploded"), hooks.engine_init_or_close("engine"):
        raise ValueError("engine exploded")
    assert prof.names() == ["begin_init", "end_init", "close"]
    hooks = RolloutProfilerHooks(RecordingRolloutProfiler(fail={"close": 0}))
    with pytest.raises(ValueError, match="engine exploded") as info, hooks.engine_init_or_close("vLLM worker"):
        raise ValueError("engine exploded")
    assert any("after failed vLLM worker init also failed" in n for n in info.value.__notes__)


def test_split_engine_init_across_calls():
    prof = RecordingRolloutProfiler()
    hooks = RolloutProfilerHooks(prof)
    hooks.begin_engine_init()
    assert hooks.init_open
    with pytest.raises(RuntimeError, match="already begun"):
        hooks.begin_engine_init()
    hooks.end_engine_init()
    with pytest.raises(RuntimeError, match="no rollout profiler engine-initialization window"):
        hooks.end_engine_init()
    assert prof.calls[1][1] is prof.token


def test_begin_rollout_before_init_window_closed_raises():
    prof = RecordingRolloutProfiler()
    hooks = RolloutProfilerHooks(prof)
    with pytest.raises(RuntimeError, match="before the rollout profiler engine-initialization window closed"):
        hooks.begin_rollout("step1/attempt1")
    hooks.begin_engine_init()
    with pytest.raises(RuntimeError, match="window closed"):
        hooks.begin_rollout("step1/attempt1")
    assert prof.names() == ["begin_init"]


def test_rollout_window_success_and_error():
    prof, hooks = _ready()
    with hooks.rollout("step1/attempt1"):
        pass
    with pytest.raises(KeyError, match="generation failed"), hooks.rollout("step1/attempt2"):
        raise KeyError("generation failed")
    assert prof.calls[2:] == [
        ("begin_rollout", "step1/attempt1"),
        ("finish_rollout",),
        ("begin_rollout", "step1/attempt2"),
        ("abort_rollout", "grpo_rollout_error"),
    ]


def test_rollout_abort_failure_does_not_mask_error():
    _prof, hooks = _ready(RecordingRolloutProfiler(fail={"abort_rollout": 0}))
    with pytest.raises(KeyError, match="generation failed") as info, hooks.rollout("step1/attempt1"):
        raise KeyError("generation failed")
    assert any("abort_rollout" in n for n in info.value.__notes__)


def test_rollout_begin_failure_aborts():
    prof, hooks = _ready(RecordingRolloutProfiler(fail={"begin_rollout": 1}))
    with pytest.raises(InjectedFailure, match="begin_rollout failed"), hooks.rollout("step1/attempt1"):
        pytest.fail("body must not run")
    assert prof.calls[-1] == ("abort_rollout", "grpo_rollout_error")
    with hooks.rollout("step1/attempt2"):
        pass
    assert prof.calls[-1] == ("finish_rollout",)


def test_split_rollout_calls_and_idempotent_abort():
    prof, hooks = _ready()
    hooks.begin_rollout("step2/attempt1")
    with pytest.raises(RuntimeError, match="already open"):
        hooks.begin_rollout("step2/attempt1")
    hooks.abort_rollout("cancelled")
    hooks.abort_rollout("cancelled")
    with pytest.raises(RuntimeError, match="without an open rollout"):
        hooks.finish_rollout()
    assert prof.names()[2:] == ["begin_rollout", "abort_rollout"]


def test_close_ends_open_init_window_first_and_cleans_up():
    prof = RecordingRolloutProfiler()
    hooks = RolloutProfilerHooks(prof)
    hooks.begin_engine_init()
    cleaned = []
    hooks.close(cleanup=lambda: cleaned.append(prof.names()[:]))
    assert prof.names() == ["begin_init", "end_init", "close"]
    assert cleaned == [["begin_init", "end_init", "close"]]
    with pytest.raises(RuntimeError, match="closed"):
        hooks.begin_rollout("step1/attempt1")


def test_close_failure_still_cleans_up():
    _prof, hooks = _ready(RecordingRolloutProfiler(fail={"close": 0}))
    cleaned = []
    with pytest.raises(InjectedFailure, match="close failed"):
        hooks.close(cleanup=lambda: cleaned.append(True))
    assert cleaned == [True]


def test_disabled_hooks_do_nothing():
    hooks = RolloutProfilerHooks(None)
    with hooks.engine_init():
        pass
    with hooks.rollout("step1/attempt1"):
        pass
    hooks.begin_rollout(1)
    hooks.finish_rollout()  # no profiler: no state checks
    hooks.abort_rollout("x")
    hooks.close()
    assert not hooks.enabled


@pytest.mark.parametrize("pp,ep,field", [(2, 1, "rollout.pp"), (1, 2, "rollout.ep")])
def test_topology_gate(pp, ep, field):
    validate_rollout_profiler_topology(pp=1, ep=1)
    with pytest.raises(ValueError, match=field):
        validate_rollout_profiler_topology(pp=pp, ep=ep)


def test_engine_worker_class_gate():
    validate_engine_worker_cls(None)
    for name in SUPPORTED_ENGINE_WORKER_CLASSES:
        validate_engine_worker_cls(name)
    with pytest.raises(ValueError, match="rollout.worker_cls 'my.custom.Worker' is not supported"):
        validate_engine_worker_cls("my.custom.Worker")

    class Custom:
        pass

    with pytest.raises(ValueError, match="Custom"):
        validate_engine_worker_cls(Custom)


def test_rank_mapping():
    assert rollout_profiler_rank(4, 3) == 7
    with pytest.raises(ValueError, match="internal_rank"):
        rollout_profiler_rank(0, -1)
    assert outer_rollout_rank({"RANK": "2"}) == 2
    with pytest.raises(RuntimeError, match="RANK is not set"):
        outer_rollout_rank({})
    with pytest.raises(RuntimeError, match="not an int"):
        outer_rollout_rank({"RANK": "two"})


def test_worker_env_vars_take_precedence_over_driver_env():
    driver = {"NRL_ROLLOUT_PROFILER_CLASS": "driver.mod.P"}
    assert rollout_profiler_class_path({"NRL_ROLLOUT_PROFILER_CLASS": "worker.mod.P"}, driver) == "worker.mod.P"
    assert rollout_profiler_class_path({}, driver) == "driver.mod.P"
    assert rollout_profiler_class_path(None, {}) is None
