"""Policy lifecycle driver (docs/plugins.md section 3)."""

from __future__ import annotations

import pytest

from harness.plugins.policy_hooks import STEP_ALREADY_OPEN, PolicyProfilerHooks
from harness.plugins.recording import InjectedFailure as Boom
from harness.plugins.recording import RecordingPolicyProfiler


class SplitWorker:
    """A minimal split-API worker with its own nested-step check (as the real worker has)."""

    def __init__(self, hooks: PolicyProfilerHooks, log: list) -> None:
        self.hooks, self.log, self.open = hooks, log, False
        self.fail_microbatch = self.fail_finish = self.fail_begin = False

    def _begin(self):
        if self.open:
            raise RuntimeError("worker: a train step is already open")
        if self.fail_begin:
            raise Boom("worker begin")
        self.open = True

    def _microbatch(self, batch):
        if self.fail_microbatch:
            raise Boom("microbatch")
        return batch * 2

    def _finish(self):
        self.log.append("worker_finish_returned")
        if self.fail_finish:
            raise Boom("finish")
        self.open = False
        return {"loss": 1.0}

    def _abort(self):
        self.open = False

    def begin_train_step(self):
        return self.hooks.begin_step(self._begin, worker_step_open=self.open)

    def train_microbatch(self, batch):
        return self.hooks.train_microbatch(self._microbatch, batch)

    def finish_train_step(self):
        return self.hooks.finish_step(self._finish)

    def abort_train_step(self):
        return self.hooks.abort_step(self._abort)


def _train(data, loss_fn=None, eval_mode=False, **extra):
    return {"data": data, "eval": eval_mode, **extra}


def test_monolithic_train_profiles_complete_update():
    prof = RecordingPolicyProfiler()
    hooks = PolicyProfilerHooks(prof)
    assert hooks.run_train(_train, 1) == {"data": 1, "eval": False}
    assert prof.names() == ["begin", "finish"] and not hooks.step_open


@pytest.mark.parametrize("how", ["kwarg", "positional"])
def test_monolithic_eval_does_not_profile(how):
    prof = RecordingPolicyProfiler()
    hooks = PolicyProfilerHooks(prof)
    train = hooks.wrap_train(_train)
    result = train(1, None, eval_mode=True) if how == "kwarg" else train(1, None, True)
    assert result["eval"] is True and prof.calls == []


def test_monolithic_wrapper_forwards_new_train_arguments():
    prof = RecordingPolicyProfiler()
    train = PolicyProfilerHooks(prof).wrap_train(_train)
    assert train(1, "loss", False, gbs=8, mbs=2) == {"data": 1, "eval": False, "gbs": 8, "mbs": 2}
    assert train.__name__ == "_train" and prof.names() == ["begin", "finish"]


def test_monolithic_train_aborts_profiler_on_error():
    prof = RecordingPolicyProfiler()
    hooks = PolicyProfilerHooks(prof)

    def failing(*_):
        raise Boom("train")

    with pytest.raises(Boom, match="train"):
        hooks.run_train(failing, 1)
    assert prof.calls == [("begin",), ("abort", "policy_train_error")]
    hooks.run_train(_train, 1)  # the next step opens normally
    assert prof.names()[-2:] == ["begin", "finish"]


def test_profiler_abort_error_does_not_mask_training_error():
    prof = RecordingPolicyProfiler(fail={"abort": 0})
    hooks = PolicyProfilerHooks(prof)

    def failing(*_):
        raise Boom("the training error")

    with pytest.raises(Boom, match="the training error") as info:
        hooks.run_train(failing, 1)
    assert any("abort_train_step" in note and "also failed" in note for note in info.value.__notes__)


def test_profiler_begin_failure_aborts_and_propagates():
    prof = RecordingPolicyProfiler(fail={"begin": 1})
    hooks = PolicyProfilerHooks(prof)
    with pytest.raises(Boom, match="begin failed"):
        hooks.run_train(_train, 1)
    assert prof.calls == [("begin",), ("abort", "policy_train_error")]


def test_profiler_finish_failure_is_not_followed_by_abort():
    prof = RecordingPolicyProfiler(fail={"finish": 1})
    hooks = PolicyProfilerHooks(prof)
    with pytest.raises(Boom, match="finish failed"):
        hooks.run_train(_train, 1)
    assert prof.names() == ["begin", "finish"] and not hooks.step_open


def test_second_begin_while_open_raises():
    prof = RecordingPolicyProfiler()
    hooks = PolicyProfilerHooks(prof)
    with hooks.train_step():
        with pytest.raises(RuntimeError, match=STEP_ALREADY_OPEN):
            hooks.run_train(_train, 1)
        with pytest.raises(RuntimeError, match=STEP_ALREADY_OPEN):
            hooks.begin_step(lambda: None, worker_step_open=False)
    assert prof.names() == ["begin", "finish"]


def test_split_step_success_and_finish_after_worker_returned():
    log: list = []
    prof = RecordingPolicyProfiler()
    prof.finish_train_step = lambda: log.append("profiler_finish")  # order probe
    worker = SplitWorker(PolicyProfilerHooks(prof), log)
    worker.begin_train_step()
    assert worker.train_microbatch(3) == 6
    assert worker.finish_train_step() == {"loss": 1.0}
    assert log == ["worker_finish_returned", "profiler_finish"]  # test_split_finish_closes_nvtx_range_before_profiler


def test_split_nested_begin_keeps_worker_error_and_leaves_profiler_alone():
    prof = RecordingPolicyProfiler()
    worker = SplitWorker(PolicyProfilerHooks(prof), [])
    worker.begin_train_step()
    with pytest.raises(RuntimeError, match="worker: a train step is already open"):
        worker.begin_train_step()
    worker.finish_train_step()
    assert prof.names() == ["begin", "finish"]


@pytest.mark.parametrize(
    "failure,reason",
    [
        ("begin", "policy_train_begin_error"),
        ("microbatch", "policy_train_microbatch_error"),
        ("finish", "policy_train_finish_error"),
    ],
)
def test_split_failures_abort_with_their_reason(failure, reason):
    prof = RecordingPolicyProfiler()
    worker = SplitWorker(PolicyProfilerHooks(prof), [])
    setattr(worker, f"fail_{failure}", True)
    # the worker's own failure of that phase, not another one (SplitWorker's messages)
    with pytest.raises(Boom, match={"begin": "worker begin", "microbatch": "microbatch", "finish": "finish"}[failure]):
        worker.begin_train_step()
        worker.train_microbatch(1)
        worker.finish_train_step()
    assert prof.calls[-1] == ("abort", reason)
    # the worker then aborts explicitly: no second abort reaches the profiler
    worker.abort_train_step()
    assert prof.names().count("abort") == 1 and prof.names().count("finish") == 0


def test_split_profiler_begin_failure_aborts_with_begin_reason():
    prof = RecordingPolicyProfiler(fail={"begin": 1})
    worker = SplitWorker(PolicyProfilerHooks(prof), [])
    with pytest.raises(Boom, match="begin failed"):
        worker.begin_train_step()
    assert prof.calls == [("begin",), ("abort", "policy_train_begin_error")]
    assert worker.open is False  # the worker's begin never ran


def test_split_explicit_abort_is_idempotent():
    prof = RecordingPolicyProfiler()
    worker = SplitWorker(PolicyProfilerHooks(prof), [])
    worker.begin_train_step()
    worker.abort_train_step()
    worker.abort_train_step()
    assert prof.calls == [("begin",), ("abort", "policy_train_step_aborted")]


def test_shutdown_closes_profiler_then_cleans_up():
    order: list[str] = []
    prof = RecordingPolicyProfiler()
    prof.close = lambda: order.append("close")
    hooks = PolicyProfilerHooks(prof)
    hooks.close(cleanup=lambda: order.append("cleanup"))
    hooks.close(cleanup=lambda: order.append("cleanup"))
    assert order == ["close", "cleanup", "cleanup"]  # profiler closed once, cleanup each time
    with pytest.raises(RuntimeError, match="closed"):
        hooks.run_train(_train, 1)


def test_shutdown_cleans_up_when_profiler_close_fails():
    cleaned: list[bool] = []
    hooks = PolicyProfilerHooks(RecordingPolicyProfiler(fail={"close": 0}))
    with pytest.raises(Boom, match="close failed"):
        hooks.close(cleanup=lambda: cleaned.append(True))
    assert cleaned == [True]


def test_disabled_hooks_are_pass_through():
    hooks = PolicyProfilerHooks(None)
    worker = SplitWorker(hooks, [])
    assert hooks.run_train(_train, 4)["data"] == 4
    worker.begin_train_step()
    worker.finish_train_step()
    worker.abort_train_step()
    cleaned = []
    hooks.close(cleanup=lambda: cleaned.append(1))
    assert cleaned == [1] and not hooks.enabled


def test_nothing_reaches_the_profiler_after_close():
    """Found by the lifecycle state machine: close with a step open, then the worker aborts."""
    prof = RecordingPolicyProfiler()
    worker = SplitWorker(PolicyProfilerHooks(prof), [])
    worker.begin_train_step()
    worker.hooks.close()
    worker.abort_train_step()
    assert prof.names() == ["begin", "close"]
