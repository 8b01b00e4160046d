"""The sending end of the ZMQ refit stream (policy rank, REQ, binds): two
ping-pong staging buffers, an oversized tensor alone from a dedicated buffer,
at most one group awaiting its ACK (protocol: ``zmq_stream``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.refit.buckets import calculate_aligned_size, tensor_nbytes
from harness.refit.packing import pack_into
from harness.refit.staging import CudaStagingBuffer, StagingBuffer
from harness.refit.tcp_stream import InlineStagingBuffer, is_tcp, take_bound
from harness.refit.zmq_common import COMPLETE, DEFAULT_TIMEOUT_MS, make_socket, translate_zmq_errors


@dataclass
class SendStats:
    """What a sender did: groups sent (data payloads) and tensor/byte counts; ``seconds``
    (filled by the caller, e.g. ``PolicyWorker.stream_weights``): wall time per sub-phase."""

    groups: int = 0
    tensors: int = 0
    packed_bytes: int = 0
    oversized: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


class _PingPongSender:
    """Sender state machine; one instance per stream."""

    def __init__(self, socket: Any, buffer_size_bytes: int, staging_dir: str | None,
                 staging_device: torch.device | None = None, inline: bool = False):
        if buffer_size_bytes < 2:
            raise ValueError(f"buffer_size_bytes must be >= 2, got {buffer_size_bytes}")
        self.socket = socket
        self.half = buffer_size_bytes // 2
        self.staging_dir = staging_dir
        self.staging_device = staging_device  # None: host staging; a cuda device: CUDA IPC
        self.inline = inline  # tcp:// across nodes: the bytes travel in the messages
        self.buffers: list[Any] = []
        self.current = 0
        self.awaiting_ack = False
        self.stats = SendStats()
        self.names: list[str] = []
        self.tensors: list[torch.Tensor] = []
        self.used = 0

    def _new_buffer(self, nbytes: int) -> Any:
        if self.inline:
            return InlineStagingBuffer.create(nbytes)
        if self.staging_device is not None:
            return CudaStagingBuffer.create(nbytes, self.staging_device)
        return StagingBuffer.create(nbytes, self.staging_dir)

    def _buffer(self, index: int) -> Any:
        while len(self.buffers) <= index:  # allocated lazily, like the reference
            self.buffers.append(self._new_buffer(calculate_aligned_size(self.half)))
        return self.buffers[index]

    def _await_ack(self) -> None:
        if self.awaiting_ack:
            self.socket.recv()
            self.awaiting_ack = False

    def _send_group(self, staging: Any, names: list[str], used: int) -> None:
        self._await_ack()
        staging.ready()  # the packed bytes are in place before the receiver may read them
        handle = staging.inline_handle(used) if self.inline else staging.handle()
        self.socket.send_pyobj((handle, list(names), used))
        self.awaiting_ack = True
        self.stats.groups += 1
        self.stats.packed_bytes += used

    def _flush(self) -> None:
        if not self.names:
            return
        staging = self._buffer(self.current)
        # The ACK for this buffer's previous contents arrived before the group
        # that followed it was sent, so re-packing here is safe.
        used = pack_into(staging.tensor, self.tensors)
        self._send_group(staging, self.names, used)
        self.current = 1 - self.current
        self.names, self.tensors, self.used = [], [], 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        aligned = calculate_aligned_size(tensor_nbytes(tensor))
        self.stats.tensors += 1
        if aligned > self.half:
            self._flush()
            dedicated = self._new_buffer(max(aligned, 1))
            try:
                used = pack_into(dedicated.tensor, [tensor])
                self._send_group(dedicated, [name], used)
                self._await_ack()  # synchronous: the dedicated buffer is freed next
            finally:
                dedicated.release()
            self.stats.oversized += 1
            return
        if self.names and self.used + aligned > self.half:
            self._flush()
        self.names.append(name)
        self.tensors.append(tensor)
        self.used += aligned

    def finish(self) -> None:
        self._flush()
        self._await_ack()
        self.release()
        self.socket.send_pyobj(COMPLETE)
        self.socket.recv()

    def release(self) -> None:
        for staging in self.buffers:
            staging.release()
        self.buffers = []


def send_weights_zmq(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    address: str,
    buffer_size_bytes: int,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    socket: Any = None,
    staging_dir: str | None = None,
    staging_device: str | torch.device | None = None,
) -> SendStats:
    """Stream ``named_tensors`` (full, HF-named) to one receiver; return what was sent.

    Binds a REQ socket on ``address`` unless ``socket`` is given. Raises
    TimeoutError when the receiver does not answer within ``timeout_ms`` and
    RuntimeError on other ZMQ failures. Staging files are removed on every
    exit path. ``staging_device`` (``"cuda"``, ``"cuda:1"``): stage in GPU
    memory of that device and send CUDA IPC handles (the tensors may live on
    the GPU or the host); ``None`` or ``"cpu"``: host shared memory, as before.
    A cuda ``staging_device`` without a usable GPU is a ValueError.

    A ``tcp://`` address (an engine on another node): the bytes travel in the
    messages (``tcp_stream``; ``staging_device`` is not used); the socket is the one
    ``tcp_stream.bind_endpoints`` bound on that address in this process, else a new
    one bound here.
    """
    inline = is_tcp(address)
    device = None if inline else _staging_device(staging_device)
    own_socket = socket is None
    if own_socket and inline:
        socket = take_bound(address)
    if socket is None:
        import zmq

        with translate_zmq_errors("sender", timeout_ms, address):
            socket = make_socket(zmq.REQ, address, timeout_ms, bind=True)
    sender = _PingPongSender(socket, buffer_size_bytes, staging_dir, device, inline=inline)
    try:
        with translate_zmq_errors("sender", timeout_ms, address):
            for name, tensor in named_tensors:
                sender.add(name, tensor)
            sender.finish()
        return sender.stats
    finally:
        sender.release()
        if own_socket:
            socket.close(linger=0)


def _staging_device(staging_device: str | torch.device | None) -> torch.device | None:
    """``None`` for host staging; the cuda device (index resolved) for CUDA IPC staging."""
    if staging_device is None:
        return None
    device = torch.device(staging_device)
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        raise ValueError(f"refit staging_device must be cpu or cuda, got {staging_device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"refit staging_device {staging_device!r}: this process sees no CUDA device")
    return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
