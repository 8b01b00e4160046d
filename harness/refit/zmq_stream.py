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

Both functions accept an already-built ``socket`` (any object with
``send_pyobj``, ``recv_pyobj``, ``send``, ``recv``) so tests can record the
message sequence; without one they create and close a real ZMQ socket.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.refit.buckets import calculate_aligned_size, tensor_nbytes
from harness.refit.packing import TensorInfo, pack_into, unpack_views
from harness.refit.staging import CUDA_IPC, CudaStagingBuffer, StagingBuffer, open_staging
from harness.refit.tcp_stream import INLINE, InlineStagingBuffer, is_tcp, open_inline, take_bound

COMPLETE = "complete"
"""Terminator message (the reference's ``IPCProtocol.COMPLETE``)."""
ACK = b"ack"
"""Acknowledgement frame (the reference's ``IPCProtocol.ACK``)."""
DEFAULT_TIMEOUT_MS = 120_000

LoadFn = Callable[[list[tuple[str, torch.Tensor]]], None]


class WeightManifestError(RuntimeError):
    """The received tensors do not match the receiver's ``state_dict_info``."""


@dataclass
class SendStats:
    """What a sender did: groups sent (data payloads) and tensor/byte counts; ``seconds``
    (filled by the caller, e.g. ``PolicyWorker.stream_weights``): wall time per sub-phase."""

    groups: int = 0
    tensors: int = 0
    packed_bytes: int = 0
    oversized: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class ReceiveStats:
    """What a receiver loaded, in arrival order."""

    loaded: list[str] = field(default_factory=list)
    groups: int = 0


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


def _make_socket(kind: int, address: str, timeout_ms: int, bind: bool) -> Any:
    import zmq

    socket = zmq.Context.instance().socket(kind)
    socket.setsockopt(zmq.SNDTIMEO, timeout_ms)
    socket.setsockopt(zmq.RCVTIMEO, timeout_ms)
    socket.setsockopt(zmq.LINGER, 0)
    if address.startswith("tcp://["):  # an IPv6 endpoint (an engine on another node)
        socket.setsockopt(zmq.IPV6, 1)
    if bind:
        socket.bind(address)
    else:
        socket.connect(address)
    return socket


def _translate_zmq_errors(side: str, timeout_ms: int, address: str):
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

        with _translate_zmq_errors("sender", timeout_ms, address):
            socket = _make_socket(zmq.REQ, address, timeout_ms, bind=True)
    sender = _PingPongSender(socket, buffer_size_bytes, staging_dir, device, inline=inline)
    try:
        with _translate_zmq_errors("sender", timeout_ms, address):
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


class _OpenedBuffers:
    """The receiver's view of the sender's staging buffers during one stream.

    Host mappings and inline groups (tcp://) are opened per group (as before); CUDA
    buffers are opened once per stream (two ping-pong buffers: two IPC opens) and
    dropped at the end.
    """

    def __init__(self) -> None:
        self.cuda: dict[str, torch.Tensor] = {}

    def open(self, handle: dict) -> torch.Tensor:
        if handle.get("kind") == INLINE:
            return open_inline(handle)
        if handle.get("kind") != CUDA_IPC:
            return open_staging(handle)
        key = str(handle["id"])
        if key not in self.cuda:
            self.cuda[key] = open_staging(handle)
        return self.cuda[key]

    @staticmethod
    def settle(buffer: torch.Tensor | None) -> None:
        """Before the ACK: the copies out of a CUDA buffer have finished (the sender reuses it next)."""
        if buffer is not None and buffer.device.type == "cuda":
            torch.cuda.current_stream(buffer.device).synchronize()

    def close(self) -> None:
        self.cuda.clear()


class _ReceiverManifest:
    """Tracks which expected tensors arrived; collects every problem seen."""

    def __init__(self, state_dict_info: Mapping[str, TensorInfo]):
        self.expected = dict(state_dict_info)
        self.loaded: set[str] = set()
        self.errors: list[str] = []

    def check_group(self, names: list[str]) -> list[str]:
        problems = []
        seen: set[str] = set()
        for name in names:
            if name in seen:
                problems.append(f"duplicate tensor {name!r} within one group")
            elif name in self.loaded:
                problems.append(f"duplicate tensor {name!r}: already loaded in an earlier group")
            elif name not in self.expected:
                problems.append(f"unexpected tensor {name!r} (not in the engine's state_dict_info)")
            seen.add(name)
        return problems

    def missing(self) -> list[str]:
        return [name for name in self.expected if name not in self.loaded]


def receive_weights_zmq(
    *,
    address: str,
    state_dict_info: Mapping[str, TensorInfo],
    load_fn: LoadFn,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    socket: Any = None,
) -> ReceiveStats:
    """Receive one stream, calling ``load_fn(list[(name, view)])`` per valid group.

    Connects a REP socket to ``address`` unless ``socket`` is given. Views
    alias the sender's staging buffer and are valid only during ``load_fn``.
    Every message is acknowledged, even a rejected group and a failing
    COMPLETE, so the sender never hangs on our error. After COMPLETE, raises
    WeightManifestError listing duplicates, unexpected and missing tensors or
    load failures; TimeoutError / RuntimeError for transport failures.
    """
    own_socket = socket is None
    if own_socket:
        import zmq

        with _translate_zmq_errors("receiver", timeout_ms, address):
            socket = _make_socket(zmq.REP, address, timeout_ms, bind=False)
    manifest = _ReceiverManifest(state_dict_info)
    stats = ReceiveStats()
    opened = _OpenedBuffers()
    try:
        with _translate_zmq_errors("receiver", timeout_ms, address):
            while True:
                message = socket.recv_pyobj()
                if isinstance(message, str) and message == COMPLETE:
                    try:
                        missing = manifest.missing()
                        if missing:
                            manifest.errors.append(f"missing tensors at COMPLETE: {missing}")
                    finally:
                        socket.send(ACK)
                    break
                handle, names, used_bytes = message
                stats.groups += 1
                views: list[tuple[str, torch.Tensor]] = []
                buffer = None
                try:
                    problems = manifest.check_group(list(names))
                    if problems:
                        manifest.errors.extend(problems)
                        continue  # skipped, but still acknowledged below
                    buffer = opened.open(handle)
                    views = unpack_views(buffer, names, manifest.expected, used_bytes)
                    load_fn(views)
                    manifest.loaded.update(names)
                    stats.loaded.extend(names)
                except Exception as exc:  # noqa: BLE001 - recorded; the stream goes on
                    manifest.errors.append(f"group starting at {names[0] if names else '?'}: {exc}")
                finally:
                    views = []
                    opened.settle(buffer)
                    buffer = None
                    socket.send(ACK)
    finally:
        opened.close()
        if own_socket:
            socket.close(linger=0)
    if manifest.errors:
        raise WeightManifestError("refit manifest check failed: " + "; ".join(manifest.errors))
    return stats
