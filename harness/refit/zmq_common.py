"""What both ends of the ZMQ refit stream share: the protocol's frames, the
manifest error, the ``ipc://`` endpoint name, socket construction and the
mapping of ZMQ failures to TimeoutError / RuntimeError.

pyzmq is imported inside the functions (the stream's callers may run without it
when they pass their own socket). The protocol itself: ``zmq_stream``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

COMPLETE = "complete"
"""Terminator message (the reference's ``IPCProtocol.COMPLETE``)."""
ACK = b"ack"
"""Acknowledgement frame (the reference's ``IPCProtocol.ACK``)."""
DEFAULT_TIMEOUT_MS = 120_000
RECONNECT_IVL_MS = 2
"""How soon a connecting socket tries again when its peer has not bound yet (ZMQ's default is
100 ms). The engine's receiver connects as soon as the driver asks it to, usually before policy
rank 0 has gathered the weights and bound its socket, so every refit stream began with one
reconnect wait: about 0.1 s of a 0.11-0.2 s stream on the 2-core box (benches/refit_reconnect.py)."""

class WeightManifestError(RuntimeError):
    """The received tensors do not match the receiver's ``state_dict_info``."""


def ipc_address(directory: str, key: str) -> str:
    """An ``ipc://`` endpoint for ``key`` (e.g. ``engine0-tp1``) under ``directory``.

    Unix socket paths are limited to ~107 bytes; a long directory falls back
    to the temp dir with a digest of the directory in the name.
    """
    path = os.path.join(directory, f"refit-{key}.sock")
    if len(path) > 100:
        digest = hashlib.sha256(directory.encode()).hexdigest()[:12]
        path = os.path.join(tempfile.gettempdir(), f"refit-{digest}-{key}.sock")
    return f"ipc://{path}"


def new_socket(kind: int, timeout_ms: int, ipv6: bool) -> Any:
    """A ZMQ socket of ``kind`` with the stream's options: send/receive timeouts of
    ``timeout_ms``, no linger, IPv6 when ``ipv6`` (shared with ``tcp_stream``)."""
    import zmq

    socket = zmq.Context.instance().socket(kind)
    socket.setsockopt(zmq.SNDTIMEO, timeout_ms)
    socket.setsockopt(zmq.RCVTIMEO, timeout_ms)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    if ipv6:
        socket.setsockopt(zmq.IPV6, 1)
    return socket


def make_socket(kind: int, address: str, timeout_ms: int, bind: bool) -> Any:
    """``new_socket`` bound to (``bind``) or connected to ``address``."""
    # an IPv6 endpoint (an engine on another node)
    socket = new_socket(kind, timeout_ms, ipv6=address.startswith("tcp://["))
    if bind:
        socket.bind(address)
    else:
        socket.connect(address)
    return socket


def translate_zmq_errors(side: str, timeout_ms: int, address: str) -> Any:
    """Context manager mapping ZMQ errors to TimeoutError / RuntimeError."""
    import contextlib

    @contextlib.contextmanager
    def guard():
        try:
            import zmq
        except ImportError:  # a fake socket without pyzmq installed
            yield
            return
        try:
            yield
        except zmq.Again as exc:
            raise TimeoutError(
                f"refit ZMQ communication timeout after {timeout_ms}ms on the {side} side ({address})"
            ) from exc
        except zmq.ZMQError as exc:
            raise RuntimeError(f"refit ZMQ error on the {side} side ({address}): {exc}") from exc

    return guard()
