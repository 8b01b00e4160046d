"""The zmq refit stream between nodes: ``tcp://`` endpoints, the bytes in the messages.

Within a node the stream (``harness.refit.zmq_stream``) sends *handles* of shared
staging memory (host file mappings, CUDA IPC) over ``ipc://`` sockets; another node
cannot open those. When a rollout engine runs on another node than policy rank 0
(the sender), the same protocol runs over ``tcp://`` with *inline* staging buffers:

* ``InlineStagingBuffer``: the sender packs a group into its own (unshared) host
  buffer, exactly as into a shared one (same ping-pong pair of
  ``buffer_size_bytes / 2`` each, same oversized-tensor rule, the same
  ``send(group) recv(ACK) ... send(COMPLETE) recv(ACK)`` sequence), and the
  group's handle carries the packed bytes themselves: ``{"kind": "inline",
  "nbytes": used, "blake2b": <digest of those bytes>, "data": bytes}``. At most
  one group is in flight (the sender awaits its ACK before the next), so
  memory stays bounded by the budget on both sides.
* ``open_inline(handle)`` (receiver): checks the byte count and the digest, then
  views the bytes as the packed ``uint8`` buffer (no copy). A mismatch raises,
  which the receiver records for that group, acknowledges, and reports at
  COMPLETE (``WeightManifestError``), like any other bad group.
* Endpoints: the sender binds. ``bind_endpoints(count, host)`` runs inside the
  sender's process (policy rank 0's actor, via ``__ray_call__``), binds ``count``
  REQ sockets on ``tcp://HOST:<free port>`` (HOST: that node's address) *before*
  the addresses leave the process, so no other process can take a port in
  between, and keeps them; ``send_weights_zmq`` to such an address takes its
  held socket (``take_bound``) and closes it at the end of the stream. The
  engine's ranks connect their REP sockets to the address as they do to ipc://.

No torch import at module level beyond what the stream needs; pyzmq is imported
where sockets are made.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import torch

INLINE = "inline"
"""``handle["kind"]`` of a group whose bytes travel in the message."""
TCP_SCHEME = "tcp://"

_HELD: dict[str, Any] = {}  # address -> bound REQ socket, in the sender's process
_LOCK = threading.Lock()


def is_tcp(address: str) -> bool:
    return address.startswith(TCP_SCHEME)


def digest(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass
class InlineStagingBuffer:
    """A ``uint8`` host buffer private to the sender; its handle carries the packed bytes."""

    nbytes: int
    tensor: torch.Tensor

    @classmethod
    def create(cls, nbytes: int) -> InlineStagingBuffer:
        if nbytes <= 0:
            raise ValueError(f"staging buffer size must be positive, got {nbytes}")
        return cls(nbytes=nbytes, tensor=torch.empty(nbytes, dtype=torch.uint8))

    def ready(self) -> None:
        """Nothing to wait for: host copies are synchronous."""

    def inline_handle(self, used: int) -> dict:
        """The group's first ``used`` bytes (copied into the message) and their digest."""
        if not 0 <= used <= self.nbytes:
            raise ValueError(f"inline staging: {used} bytes used of a {self.nbytes}-byte buffer")
        data = self.tensor[:used].numpy().tobytes()
        return {"kind": INLINE, "nbytes": used, "blake2b": digest(data), "data": data}

    def release(self) -> None:
        self.tensor = torch.empty(0, dtype=torch.uint8)


def open_inline(handle: dict) -> torch.Tensor:
    """The packed buffer of an inline group, after its size and digest were checked."""
    data = handle.get("data")
    if not isinstance(data, bytes | bytearray):
        raise RuntimeError(f"inline refit group without bytes (got {type(data).__name__})")
    nbytes = int(handle.get("nbytes", -1))
    if len(data) != nbytes:
        raise RuntimeError(f"inline refit group: {len(data)} bytes received, the sender packed {nbytes}")
    got = digest(data)
    if got != handle.get("blake2b"):
        raise RuntimeError(f"inline refit group: payload digest {got} differs from the sender's "
                           f"{handle.get('blake2b')} (bytes corrupted in transit)")
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():  # read-only bytes: the views are only copied from
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(data, dtype=torch.uint8)


def bind_endpoints(count: int, host: str, timeout_ms: int) -> list[str]:
    """Bind ``count`` REQ sockets on ``tcp://host:<free port>`` in this process; keep them
    for ``take_bound`` and return their addresses (``tcp://host:port``)."""
    import zmq

    from harness.refit.zmq_common import new_socket

    out = []
    for _ in range(int(count)):
        socket = new_socket(zmq.REQ, timeout_ms, ipv6=":" in host)  # ":": an IPv6 node address
        try:
            port = socket.bind_to_random_port(f"{TCP_SCHEME}{_bind_host(host)}")
        except zmq.ZMQError as exc:
            socket.close(linger=0)
            raise RuntimeError(f"refit: cannot bind a tcp:// endpoint on {host}: {exc}") from exc
        address = f"{TCP_SCHEME}{_bind_host(host)}:{port}"
        with _LOCK:
            _HELD[address] = socket
        out.append(address)
    return out


def bind_in_actor(actor_self: Any, count: int, timeout_ms: int) -> list[str]:
    """``__ray_call__`` form of :func:`bind_endpoints` on the actor's own node address."""
    import ray

    return bind_endpoints(count, ray.util.get_node_ip_address(), timeout_ms)


def take_bound(address: str) -> Any | None:
    """The socket ``bind_endpoints`` bound on ``address`` (the caller closes it), or None."""
    with _LOCK:
        return _HELD.pop(address, None)


def close_bound() -> int:
    """Close every socket still held (a stream that never ran); returns how many."""
    with _LOCK:
        held = list(_HELD.values())
        _HELD.clear()
    for socket in held:
        socket.close(linger=0)
    return len(held)


def close_in_actor(actor_self: Any) -> int:
    """``__ray_call__`` form of :func:`close_bound`."""
    return close_bound()


def _bind_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
