"""One refit over real ZMQ sockets in this process: the sender in a thread, the receiver here
(the zmq and tcp stream tests)."""

from __future__ import annotations

import threading

import torch

from harness.refit.zmq_stream import receive_weights_zmq, send_weights_zmq


def state_info(sd: dict[str, torch.Tensor]) -> dict:
    """What a receiver expects of ``sd``: name -> (shape, dtype)."""
    return {n: (tuple(t.shape), t.dtype) for n, t in sd.items()}


def stream_in_thread(address: str, sent: dict[str, torch.Tensor], expected_info: dict, *, buffer_size: int = 4096,
                     timeout_ms: int = 10_000, outcome: dict | None = None):
    """Send ``sent`` to ``address`` from a thread and receive it here: ``(receiver stats,
    received tensors, outcome)``. ``outcome`` (filled in even when the receiver raises)
    gets the sender's ``stats`` or its ``error``; the sender thread must end."""
    outcome = {} if outcome is None else outcome

    def sender():
        try:
            outcome["stats"] = send_weights_zmq(sent.items(), address=address, buffer_size_bytes=buffer_size,
                                                timeout_ms=timeout_ms)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the test
            outcome["error"] = exc

    thread = threading.Thread(target=sender)
    thread.start()
    received: dict[str, torch.Tensor] = {}
    try:
        stats = receive_weights_zmq(address=address, state_dict_info=expected_info, timeout_ms=timeout_ms,
                                    load_fn=lambda views: received.update({n: v.clone() for n, v in views}))
        return stats, received, outcome
    finally:
        thread.join(30)
        assert not thread.is_alive(), "sender thread hung"
