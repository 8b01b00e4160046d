"""One full-weights gather per engine refit, however many TP ranks the engine has.

``harness.grpo.refitter.stream_to_each`` runs in every policy rank and calls the rank's own
``PolicyWorkerImpl.stream_weights`` once per engine address; ``gathered_once`` makes the
engine's collective ``hf_state_dict`` run once for all of them. The engine here is a
stand-in that counts its gathers (the real engines need a process group); the worker code
it drives is the real ``PolicyWorkerImpl.stream_weights`` on a rank other than 0, which
gathers and returns ``None`` without streaming (rank 0's streams need live receivers: the
golden runs with TP2 engines, e.g. ``qwen3_moe_tiny_dtensor``, cover them).
"""

from __future__ import annotations

import pytest
import torch

from harness.grpo.refitter import gathered_once, stream_to_each
from harness.policy.worker import PolicyWorkerImpl


class CountingEngine:
    """``hf_state_dict`` as the engines define it: a method, a collective on every call."""

    DEVICE_STATE_DICT = True

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def hf_state_dict(self, **kwargs):
        self.calls.append(dict(kwargs))
        return {"w": torch.full((2,), float(len(self.calls)))}


def _worker(rank: int) -> PolicyWorkerImpl:
    worker = PolicyWorkerImpl.__new__(PolicyWorkerImpl)  # no process group: only stream_weights is used
    worker.rank = rank
    worker.engine = CountingEngine()
    return worker


def test_three_addresses_one_gather_and_the_method_comes_back():
    worker = _worker(rank=1)
    out = stream_to_each(worker, ["ipc:///a", "ipc:///b", "ipc:///c"], {"buffer_size_bytes": 1024})
    assert out == [None, None, None]  # a rank other than 0 only takes part in the gather
    assert worker.engine.calls == [{}]  # one gather, the plain (host copy) form
    assert "hf_state_dict" not in vars(worker.engine)  # the class's method again
    worker.engine.hf_state_dict()
    assert len(worker.engine.calls) == 2  # outside the window every call gathers again


def test_every_call_in_the_window_gets_the_first_gathers_tensors():
    engine = CountingEngine()
    with gathered_once(engine):
        first = engine.hf_state_dict()
        again = engine.hf_state_dict()
        on_device = engine.hf_state_dict(on_device=True)  # another form is another gather
        on_device_again = engine.hf_state_dict(on_device=True)
    assert again is first and on_device_again is on_device and on_device is not first
    assert engine.calls == [{}, {"on_device": True}]


def test_the_method_comes_back_when_a_stream_fails():
    engine = CountingEngine()
    with pytest.raises(RuntimeError, match="stream to ipc:///b failed"), gathered_once(engine):
        engine.hf_state_dict()
        raise RuntimeError("stream to ipc:///b failed")
    assert "hf_state_dict" not in vars(engine)
