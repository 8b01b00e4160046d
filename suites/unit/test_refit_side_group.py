"""The refit side group: every member joins the driver's held store as a client, one group per
member per session (``SideGroupSlot``), closing releases the member's store connection.

Real gloo groups; the members are threads of this process (one ``ProcessGroupGloo`` each),
which exercises the same rendezvous and collectives as separate processes.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest
import torch

from harness.parallel.rendezvous import RendezvousServer
from harness.refit.broadcast import (
    SideGroupSlot,
    broadcast_weights,
    create_side_group,
    receive_broadcast,
)
from harness.refit.packing import TensorInfo
from suites.tcp_connections import established, settles_to

WORLD = 3
TIMEOUT_S = 60.0


def _in_threads(fns: list[Callable[[], object]]) -> list[object]:
    """Run the members concurrently; results in order; the first member error is re-raised."""
    results: list[object] = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * TIMEOUT_S)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a side-group member hung"
    return results


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(7, 5, generator=g),
        "b.bias": torch.randn(33, generator=g).to(torch.bfloat16),
        "c.table": torch.randint(0, 1000, (4, 9), generator=g),
    }


def _info(state: dict[str, torch.Tensor]) -> dict[str, TensorInfo]:
    return {name: (tuple(t.shape), t.dtype) for name, t in state.items()}


def test_create_side_group_refuses_bad_arguments_naming_the_field():
    base = {"host": "127.0.0.1", "port": 1234, "rank": 0, "world_size": 2}
    for bad, field in [
        ({"world_size": 1}, "world_size"),
        ({"rank": 2}, "rank"),
        ({"rank": -1}, "rank"),
        ({"host": ""}, "host"),
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"backend": "mpi"}, "backend"),
        ({"prefix": ""}, "prefix"),
    ]:
        with pytest.raises(ValueError, match=field):
            create_side_group(**{**base, **bad})
    with pytest.raises(TypeError, match="port"):
        create_side_group(**{**base, "port": "1234"})


def test_a_store_nobody_serves_is_a_clear_error_naming_rank_and_address():
    # bound but not listening: connecting is refused, and no member may take the port over
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        with pytest.raises(
            RuntimeError, match=rf"side-group rank 0 of 2: cannot join the refit store at 127.0.0.1:{port}"
        ):
            create_side_group(host="127.0.0.1", port=port, rank=0, world_size=2, timeout_s=1.0)


def test_every_member_rank0_included_joins_the_held_store_as_a_client():
    """Regression for pick-then-bind: the port is already bound (by the driver's RendezvousServer)
    when the members learn it. Rank 0 binding it itself, as before, fails here."""
    store = RendezvousServer()
    try:
        groups = _in_threads([
            (lambda r=r: create_side_group(host=store.host, port=store.port, rank=r, world_size=WORLD,
                                           timeout_s=TIMEOUT_S, prefix="t-clients"))
            for r in range(WORLD)
        ])
        state = _weights(1)
        got: dict[str, torch.Tensor] = {}
        _in_threads([
            lambda: broadcast_weights(state.items(), groups[0], buffer_size_bytes=256),
            lambda: receive_broadcast(groups[1], state_dict_info=_info(state), buffer_size_bytes=256,
                                      load_fn=lambda views: got.update({n: v.clone() for n, v in views})),
            lambda: receive_broadcast(groups[2], state_dict_info=_info(state), buffer_size_bytes=256,
                                      load_fn=lambda views: None),
        ])
        assert all(torch.equal(got[n], state[n]) for n in state) and list(got) == list(state)
        for g in groups:
            g.close()
            g.close()  # idempotent
        with pytest.raises(RuntimeError, match="side-group rank 1: the side group is closed"):
            groups[1].broadcast(torch.zeros(1), 0)
    finally:
        store.close()


def test_slot_keeps_one_group_per_session_and_close_releases_its_connection():
    store = RendezvousServer()
    port = store.port
    base = established(port)  # the serving store's own client connection
    slots = [SideGroupSlot() for _ in range(WORLD)]
    session = {"host": store.host, "port": port, "world_size": WORLD, "timeout_s": TIMEOUT_S, "prefix": "t-session-1"}
    try:
        first: list[object] = []
        for refit in range(3):
            state = _weights(10 + refit)
            received: dict[str, torch.Tensor] = {}

            def sender(state=state):
                return broadcast_weights(state.items(), slots[0].join(rank=0, **session), buffer_size_bytes=200)

            def receiver(r, state=state, received=received):
                keep = (lambda views: received.update({n: v.clone() for n, v in views})) if r == 1 else (lambda v: None)
                return receive_broadcast(slots[r].join(rank=r, **session), state_dict_info=_info(state),
                                         load_fn=keep, buffer_size_bytes=200)

            _in_threads([sender, lambda: receiver(1), lambda: receiver(2)])
            assert list(received) == list(state)
            assert all(torch.equal(received[n], state[n]) for n in state), refit  # bit-exact after every refit
            groups = [s.join(rank=r, **session) for r, s in enumerate(slots)]  # no collective: all cached
            if refit == 0:
                first = groups
            assert [g is f for g, f in zip(groups, first)] == [True] * WORLD  # reused, not rebuilt
            assert [s.created for s in slots] == [1] * WORLD
            assert [len(s.describe()) for s in slots] == [1] * WORLD
            # one store connection per member however many refits ran
            assert settles_to(port, base + WORLD) == base + WORLD

        # a new session (different prefix) replaces the group: still one per member
        renewed = dict(session, prefix="t-session-2")
        _in_threads([(lambda r=r: slots[r].join(rank=r, **renewed)) for r in range(WORLD)])
        assert all(g.closed for g in first)
        assert [s.created for s in slots] == [2] * WORLD
        assert [s.describe()[0]["prefix"] for s in slots] == ["t-session-2"] * WORLD
        assert settles_to(port, base + WORLD) == base + WORLD

        for s in slots:
            s.close()
            s.close()  # idempotent
        assert [s.describe() for s in slots] == [[]] * WORLD
        assert settles_to(port, base) == base  # nothing leaked: every member connection closed
    finally:
        for s in slots:
            s.close()
        store.close()
