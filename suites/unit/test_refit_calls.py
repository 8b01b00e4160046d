"""harness.rollout.refit_calls: a rollout worker's refit request, checked and fanned out per TP rank."""

from __future__ import annotations

import pytest

from harness.refit.zmq_stream import DEFAULT_TIMEOUT_MS
from harness.rollout.refit_calls import per_rank_refit_calls

BROADCAST = {"host": "10.0.0.1", "port": "2900", "world_size": 5, "rank_offset": 3, "buffer_size_bytes": 1024}


def no_default() -> list[str]:
    raise AssertionError("the default addresses must not be asked for when the caller gives them")


def test_zmq_gives_one_address_per_tp_rank_with_the_default_timeout():
    method, calls = per_rank_refit_calls("engine0", 2, "zmq", {}, lambda: ["ipc://a", "ipc://b"])
    assert method == "receive_weights_zmq"
    assert calls == [{"address": "ipc://a", "timeout_ms": DEFAULT_TIMEOUT_MS},
                     {"address": "ipc://b", "timeout_ms": DEFAULT_TIMEOUT_MS}]
    _, calls = per_rank_refit_calls("engine0", 1, "zmq", {"addresses": ["tcp://h:1"], "timeout_ms": "7"}, no_default)
    assert calls == [{"address": "tcp://h:1", "timeout_ms": 7}]


def test_zmq_refuses_an_address_count_that_is_not_the_tp_size():
    with pytest.raises(ValueError, match=r"zmq refit of engine1: 1 addresses for tp=2"):
        per_rank_refit_calls("engine1", 2, "zmq", {"addresses": ["ipc://a"]}, no_default)


def test_broadcast_ranks_follow_the_offset_densely():
    method, calls = per_rank_refit_calls("engine0", 2, "broadcast", {**BROADCAST, "prefix": "s1"}, no_default)
    assert method == "receive_weights_broadcast"
    assert [c["rank"] for c in calls] == [3, 4]
    assert calls[0] == {"host": "10.0.0.1", "port": 2900, "world_size": 5, "rank": 3, "buffer_size_bytes": 1024,
                        "src": 0, "prefix": "s1"}


@pytest.mark.parametrize("missing", sorted(BROADCAST))
def test_broadcast_names_each_missing_field(missing):
    kw = {k: v for k, v in BROADCAST.items() if k != missing}
    with pytest.raises(ValueError, match=rf"broadcast refit of engine0 needs \['{missing}'\]"):
        per_rank_refit_calls("engine0", 1, "broadcast", kw, no_default)


def test_an_unknown_transport_is_refused():
    with pytest.raises(ValueError, match=r"must be 'zmq' or 'broadcast', got 'nccl'"):
        per_rank_refit_calls("engine0", 1, "nccl", {}, no_default)
