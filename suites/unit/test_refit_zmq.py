"""The ZMQ refit stream over real sockets (sender in a thread, receiver here)."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from harness.refit.staging import default_staging_dir
from harness.refit.zmq_stream import WeightManifestError, ipc_address, receive_weights_zmq, send_weights_zmq
from suites.refit_stream import state_info, stream_in_thread


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sd = {f"layer{i}.w": torch.randn(i * 31 + 3, generator=gen) for i in range(12)}
    sd["embed"] = torch.randn(40, 50, generator=gen)  # 8000 bytes: oversized for a 4 KiB budget
    sd["half"] = torch.randn(17, generator=gen).to(torch.bfloat16)
    return sd


def _stream(tmp_path, sent, expected_info, buffer_size=4096, timeout_ms=10_000, outcome=None):
    """Send ``sent`` from a thread and receive it here over ipc:// (``suites.refit_stream``)."""
    return stream_in_thread(ipc_address(str(tmp_path), "t"), sent, expected_info, buffer_size=buffer_size,
                            timeout_ms=timeout_ms, outcome=outcome)


def _staging_files():
    return {f for f in os.listdir(default_staging_dir()) if f.startswith(f"harness-refit-{os.getpid()}-")}


def test_zmq_stream_is_bit_exact_and_cleans_up(tmp_path):
    sd = _state()
    before = _staging_files()
    stats, received, outcome = _stream(tmp_path, sd, state_info(sd))
    assert "error" not in outcome
    assert list(received) == list(sd) == stats.loaded
    for name, t in sd.items():
        assert torch.equal(received[name], t), name
    assert outcome["stats"].oversized == 1 and outcome["stats"].groups == stats.groups
    assert _staging_files() == before


def test_zmq_receiver_rejects_unexpected_and_missing_but_acks(tmp_path):
    sd = _state()
    expected = state_info(sd)
    expected["never.sent"] = ((3,), torch.float32)
    sent = dict(sd)
    sent["surprise"] = torch.zeros(2)
    expected.pop("layer0.w")
    outcome: dict = {}
    with pytest.raises(WeightManifestError) as info:
        _stream(tmp_path, sent, expected, outcome=outcome)
    message = str(info.value)
    assert "'surprise'" in message and "never.sent" in message
    assert "layer0.w" in message  # sent but not expected: unexpected
    # The receiver drained and acknowledged every group before raising, so the
    # sender finished cleanly instead of timing out on a missing ack.
    assert "error" not in outcome, outcome.get("error")
    assert outcome["stats"].groups >= 1 and outcome["stats"].tensors == len(sent)


def test_zmq_receiver_rejects_duplicates(tmp_path):
    sd = _state()
    address = ipc_address(str(tmp_path), "dup")
    pairs = list(sd.items()) + [("layer1.w", sd["layer1.w"])]
    errors: dict = {}
    thread = threading.Thread(
        target=lambda: errors.setdefault(
            "s", send_weights_zmq(pairs, address=address, buffer_size_bytes=4096, timeout_ms=10_000)
        )
    )
    thread.start()
    with pytest.raises(WeightManifestError, match="duplicate tensor 'layer1.w'"):
        receive_weights_zmq(address=address, state_dict_info=state_info(sd), load_fn=lambda v: None, timeout_ms=10_000)
    thread.join(30)
    assert "s" in errors  # the sender completed: the receiver acknowledged everything


def test_zmq_timeouts_are_clear(tmp_path):
    address = ipc_address(str(tmp_path), "lonely")
    with pytest.raises(TimeoutError, match="receiver side"):
        receive_weights_zmq(address=address, state_dict_info={}, load_fn=lambda v: None, timeout_ms=200)
    with pytest.raises(TimeoutError, match="sender side"):
        send_weights_zmq([("a", torch.zeros(4))], address=address, buffer_size_bytes=1024, timeout_ms=200)


def test_a_receiver_before_the_sender_retries_its_connect_at_once(tmp_path):
    """The engine's receiver connects before policy rank 0 binds (it gathers the weights first):
    its retry is scheduled about RECONNECT_IVL_MS later, not after ZMQ's default 100 ms (which every
    refit stream waited once). The monitor's CONNECT_RETRIED event carries the interval."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    from harness.refit.zmq_common import RECONNECT_IVL_MS, make_socket

    assert RECONNECT_IVL_MS < 10
    address = ipc_address(str(tmp_path), "early")
    receiver = make_socket(zmq.REP, address, 5_000, bind=False)  # nothing bound there yet
    monitor = receiver.get_monitor_socket(zmq.EVENT_CONNECT_RETRIED)
    monitor.setsockopt(zmq.RCVTIMEO, 5_000)
    try:
        event = recv_monitor_message(monitor)
        # libzmq adds a random jitter below the interval itself (100-199 ms with its default)
        assert event["event"] == zmq.EVENT_CONNECT_RETRIED
        assert RECONNECT_IVL_MS <= event["value"] < 2 * RECONNECT_IVL_MS
    finally:
        receiver.disable_monitor()
        monitor.close(linger=0)
        receiver.close(linger=0)
