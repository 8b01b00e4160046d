"""The receiving end of the ZMQ refit stream (engine rank, REP, connects): opens
each group's staging buffer, checks the names against the engine's
``state_dict_info``, always acknowledges, and raises ``WeightManifestError``
after COMPLETE when anything was wrong (protocol: ``zmq_stream``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.refit.packing import TensorInfo, unpack_views
from harness.refit.staging import CUDA_IPC, open_staging
from harness.refit.tcp_stream import INLINE, open_inline
from harness.refit.zmq_common import (
    ACK,
    COMPLETE,
    DEFAULT_TIMEOUT_MS,
    WeightManifestError,
    make_socket,
    translate_zmq_errors,
)

LoadFn = Callable[[list[tuple[str, torch.Tensor]]], None]


@dataclass
class ReceiveStats:
    """What a receiver loaded, in arrival order."""

    loaded: list[str] = field(default_factory=list)
    groups: int = 0


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

        with translate_zmq_errors("receiver", timeout_ms, address):
            socket = make_socket(zmq.REP, address, timeout_ms, bind=False)
    manifest = _ReceiverManifest(state_dict_info)
    stats = ReceiveStats()
    opened = _OpenedBuffers()
    try:
        with translate_zmq_errors("receiver", timeout_ms, address):
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
