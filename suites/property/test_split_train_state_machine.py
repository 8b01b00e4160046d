"""The real split-train API as a hypothesis state machine (issue 8 item 7).

A 1-rank gloo world (initialised once for the module on a free port) and a
tiny 1-layer model: each example builds a fresh :class:`NativePolicyEngine` and
drives ``begin_train_step`` / ``train_microbatch`` / ``finish_train_step`` /
``abort_train_step`` in any order, through :class:`PolicyProfilerHooks` with a
:class:`RecordingPolicyProfiler` (with injected profiler failures), exactly as
``PolicyWorker`` routes them.

Invariants (harness/policy/split_step.py, docs/plugins.md section 3):

* at most one open step; the engine's ``step_open`` matches the model;
* begin while open -> ``RuntimeError(STEP_ALREADY_OPEN)``; microbatch / finish
  without an open step -> ``RuntimeError(NO_STEP_OPEN)``; abort is idempotent;
* finish returns loss metrics (counts > 0) after >= 1 valid microbatch;
* the profiler sees at most one finish-or-abort per begun step, never an end
  without a begin, and a profiler step is open only while the worker's is.

Finishing a step that had no microbatch is refused (a bug this machine found:
it used to take an optimizer step); see the separate test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from harness.parallel.rendezvous import RendezvousServer
from harness.plugins.policy_hooks import ABORT_REASONS, PolicyProfilerHooks
from harness.plugins.recording import InjectedFailure, RecordingPolicyProfiler
from harness.policy.distributed import init_distributed
from harness.policy.native.engine import NativePolicyEngine
from harness.policy.split_step import EMPTY_STEP, NO_STEP_OPEN, STEP_ALREADY_OPEN
from harness.policy.synthetic import synthetic_batch
from harness.spec import load_spec
from harness.spec.typed import as_workload
from suites.local_world import with_layout

SPEC_PATH = str(Path(__file__).resolve().parents[2] / "goldens/qwen3_moe_tiny_tp2pp2cp2ep2/workload.yaml")
_STATE: dict = {}


def _spec():
    spec = load_spec(SPEC_PATH)
    spec = with_layout(spec, tp=1, pp=1, cp=1, ep=1, dp=1, micro_batch_size=1, seq_len=16)
    spec["model"] = {**spec["model"], "layers": 1}
    spec["plugins"] = {**spec["plugins"], "policy_profiler": None}
    return as_workload(spec)  # an engine receives the typed workload (a plan's), never a dict


@pytest.fixture(scope="module", autouse=True)
def one_rank_world():
    was_init = dist.is_initialized()
    was_det = torch.are_deterministic_algorithms_enabled()
    if was_init and dist.get_world_size() != 1:
        pytest.skip("a default process group of another size is already initialised")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    held = RendezvousServer()  # this process serves the store its one rank joins
    _STATE["store"] = held
    init_distributed(0, 1, held.host, held.port)
    spec = _spec()
    _STATE["spec"] = spec
    _STATE["batch"] = synthetic_batch(spec, 4, seed=0)
    yield
    _STATE.clear()
    torch.use_deterministic_algorithms(was_det)
    torch.set_num_threads(threads)
    if not was_init and dist.is_initialized():
        dist.destroy_process_group()


def _rows(batch, n):
    return {k: v[:n] for k, v in batch.items()}


class SplitTrain(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = NativePolicyEngine(_STATE["spec"], 0)
        self.batch = _STATE["batch"]
        self.profiler = RecordingPolicyProfiler()
        self.hooks = PolicyProfilerHooks(self.profiler)
        self.open = False  # model of the worker's step
        self.microbatches = 0  # valid microbatches in the open step
        self.steps = 0

    # -- profiler faults ---------------------------------------------------------------
    @rule(method=st.sampled_from(["begin", "finish", "abort"]))
    def arm_profiler_failure(self, method):
        self.profiler.fail[method] = sum(1 for c in self.profiler.calls if c[0] == method) + 1

    def _profiler_failed_last(self) -> bool:
        return bool(self.profiler.failed) and self.profiler.failed[-1] == len(self.profiler.calls) - 1

    # -- split API -------------------------------------------------------------------
    @rule()
    def begin(self):
        try:
            self.hooks.begin_step(self.engine.begin_train_step, worker_step_open=self.engine.step_open)
        except RuntimeError as exc:
            assert self.open and str(exc) == STEP_ALREADY_OPEN, exc
            return
        except InjectedFailure:
            assert not self.open and not self.engine.step_open  # profiler begin failed: worker never began
            return
        assert not self.open, "begin succeeded while a step was open"
        self.open, self.microbatches = True, 0

    @rule(rows=st.integers(1, 3))
    def microbatch(self, rows):
        try:
            metrics = self.hooks.train_microbatch(self.engine.train_microbatch, _rows(self.batch, rows))
        except RuntimeError as exc:
            assert not self.open and str(exc) == NO_STEP_OPEN, exc
            return
        assert self.open, "train_microbatch succeeded without an open step"
        assert "loss" in metrics and torch.isfinite(torch.tensor(metrics["loss"]))
        self.microbatches += 1

    @rule(kind=st.sampled_from(["empty", "missing_key"]))
    def bad_microbatch(self, kind):
        batch = (
            _rows(self.batch, 0)
            if kind == "empty"
            else {k: v for k, v in _rows(self.batch, 1).items() if k != "advantages"}
        )
        with pytest.raises(RuntimeError if not self.open else ValueError) as info:
            self.hooks.train_microbatch(self.engine.train_microbatch, batch)
        if not self.open:
            assert str(info.value) == NO_STEP_OPEN
        else:  # the chunk's own fault, named (not some other ValueError)
            want = "batch of 0 samples" if kind == "empty" else "missing field 'advantages'"
            assert want in str(info.value), info.value
        # a rejected chunk leaves the worker step open (its profiler step is aborted)
        assert self.engine.step_open == self.open
        assert not self.hooks.step_open or self.open

    @precondition(lambda self: not self.open or self.microbatches > 0)
    @rule()
    def finish(self):
        try:
            metrics = self.hooks.finish_step(self.engine.finish_train_step)
        except RuntimeError as exc:
            if self.open:  # an empty step is refused and stays open (abort closes it)
                assert self.microbatches == 0 and str(exc) == EMPTY_STEP, exc
                return
            assert str(exc) == NO_STEP_OPEN, exc
            return
        except InjectedFailure:
            # the worker finished; only the profiler's finish raised
            assert self.open and self._profiler_failed_last()
            self.open = False
            self.steps += 1
            return
        assert self.open, "finish succeeded without an open step"
        assert self.microbatches >= 1
        assert "loss" in metrics and metrics["global_valid_toks"] > 0 and metrics["global_valid_seqs"] > 0
        self.open = False
        self.steps += 1

    @rule()
    def abort(self):
        for _ in range(2):  # idempotent: the second call changes nothing
            before = list(self.profiler.calls)
            try:
                self.hooks.abort_step(self.engine.abort_train_step)
            except InjectedFailure:
                assert self._profiler_failed_last()
            self.open = False
            assert not self.engine.step_open and not self.hooks.step_open
        assert self.profiler.calls[len(before):] == []  # second abort reached nobody
        assert all(p.grad is None for _, p in self.engine.named)  # gradients dropped

    @rule(chunks=st.integers(1, 2))
    def whole_step(self, chunks):
        """begin, chunks x microbatch, finish: the common path, so finishes are frequent."""
        self.begin()
        for _ in range(chunks):
            self.microbatch(1)
        if not self.open or self.microbatches > 0:
            self.finish()

    @rule()
    def monolithic_while_open(self):
        if not self.open:
            return
        with pytest.raises(RuntimeError, match="split train step is open"):
            self.engine.train(_rows(self.batch, 2))

    # -- invariants ------------------------------------------------------------------
    @invariant()
    def engine_matches_model(self):
        assert self.engine.step_open == self.open
        assert self.engine.steps_done == self.steps

    @invariant()
    def profiler_step_only_inside_worker_step(self):
        assert not self.hooks.step_open or self.engine.step_open

    @invariant()
    def one_end_per_begin(self):
        state = "idle"
        for call in self.profiler.calls:
            if call[0] == "begin":
                assert state == "idle", self.profiler.calls
                state = "open"
            elif call[0] in ("finish", "abort"):
                assert state == "open", self.profiler.calls
                state = "idle"
                if call[0] == "abort":
                    assert call[1] in ABORT_REASONS
        assert self.hooks.step_open == (state == "open")


TestSplitTrain = SplitTrain.TestCase
# Few examples (each builds an engine), scaled up in the nightly profile.
TestSplitTrain.settings = settings(
    max_examples=max(40, settings().max_examples // 10), stateful_step_count=20, deadline=None
)


def test_finish_without_microbatch_takes_no_step():
    """Found by the state machine: finishing an empty step used to step AdamW
    (momentum moved the weights) and return zero-count metrics."""
    engine = NativePolicyEngine(_STATE["spec"], 0)
    engine.begin_train_step()
    engine.train_microbatch(_rows(_STATE["batch"], 2))
    engine.finish_train_step()  # Adam now has momentum
    before = {n: p.detach().clone() for n, p in engine.named}
    engine.begin_train_step()
    with pytest.raises(RuntimeError, match="no microbatch"):
        engine.finish_train_step()
    assert engine.step_open  # still open: the caller must abort it
    engine.abort_train_step()
    assert engine.steps_done == 1
    assert all(torch.equal(before[n], p) for n, p in engine.named)
