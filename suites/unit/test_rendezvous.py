"""The rendezvous store is bound before its port is handed out (no pick-then-bind race)."""

from __future__ import annotations

import errno
import socket

import pytest

from harness.parallel.rendezvous import RendezvousServer, join_rendezvous


def test_held_store_port_is_taken_while_held_and_ranks_can_join():
    held = RendezvousServer()
    with socket.socket() as other, pytest.raises(OSError) as info:
        other.bind((held.host, held.port))  # nobody else can take it between hand-out and join
    assert info.value.errno == errno.EADDRINUSE  # taken, not some other bind failure
    client = join_rendezvous(held.host, held.port, timeout_s=10)
    client.set("rank0", "ready")
    assert join_rendezvous(held.host, held.port, timeout_s=10).get("rank0") == b"ready"
    held.close()
    held.close()  # idempotent


def test_two_held_stores_get_different_ports():
    a, b = RendezvousServer(), RendezvousServer()
    assert a.port != b.port
