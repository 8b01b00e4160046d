"""Colocated refit over ZMQ REQ/REP with two ping-pong staging buffers.

Protocol (sender = policy rank, REQ, *binds*; receiver = engine rank, REP,
*connects*)::

    send(group_0) [recv(ack) send(group_i)]* recv(ack) send(COMPLETE) recv(ack)

* The budget ``buffer_size_bytes`` is halved; two staging buffers of
  ``calculate_aligned_size(half)`` bytes alternate. A group is sent when the
  next tensor would not fit; before sending, the ACK of the previous group is
  awaited, so at most one group is outstanding and a buffer is re-packed only
  after its previous contents were acknowledged.
* A tensor whose aligned size exceeds ``half`` is sent alone from a
  dedicated buffer and its ACK is awaited synchronously.
* A data payload is ``(handle, names, used_bytes)``; the handle maps the
  staging buffer (see ``staging.py``).
* Staging memory: host file mappings by default; with ``staging_device``
  a cuda device, GPU buffers shared by CUDA IPC handle (colocated engines on
  one GPU: the sender packs on the device, the receiver rebuilds the buffer
  from the handle and copies on the device, and each side synchronises its
  stream before it sends the handle or the ACK). The receiver opens either
  kind; it opens each CUDA buffer once per stream.
* Across nodes (a ``tcp://`` address, ``harness.refit.tcp_stream``): the same
  protocol with inline buffers, whose handle carries the packed bytes and their
  digest (checked by the receiver); ``staging_device`` is not used there.
* The receiver validates names against ``state_dict_info`` (duplicates,
  unexpected names; missing names at COMPLETE), always ACKs, and raises
  ``WeightManifestError`` after acknowledging COMPLETE if anything was wrong.

The code: ``zmq_common`` (frames, errors, sockets), ``zmq_sender``
(``send_weights_zmq``) and ``zmq_receiver`` (``receive_weights_zmq``); this
module re-exports their public names, the import path callers use.

Both functions accept an already-built ``socket`` (any object with
``send_pyobj``, ``recv_pyobj``, ``send``, ``recv``) so tests can record the
message sequence; without one they create and close a real ZMQ socket.
"""


from harness.refit.zmq_common import (
    ACK,
    COMPLETE,
    DEFAULT_TIMEOUT_MS,
    WeightManifestError,
    ipc_address,
    make_socket,
    translate_zmq_errors,
)
from harness.refit.zmq_receiver import LoadFn, ReceiveStats, receive_weights_zmq
from harness.refit.zmq_sender import SendStats, _staging_device, send_weights_zmq

__all__ = [
    "ACK",
    "COMPLETE",
    "DEFAULT_TIMEOUT_MS",
    "LoadFn",
    "ReceiveStats",
    "SendStats",
    "WeightManifestError",
    "_staging_device",
    "ipc_address",
    "make_socket",
    "receive_weights_zmq",
    "send_weights_zmq",
    "translate_zmq_errors",
]
