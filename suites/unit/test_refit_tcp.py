"""The zmq refit stream over tcp:// (an engine on another node), on real loopback sockets.

The sender binds its endpoint first (``tcp_stream.bind_endpoints``, as policy rank 0 does
before the address leaves its process) and streams from a thread; the receiver connects
here. suites/integration/test_cluster_two_node.py runs it between two Ray nodes.
"""

from __future__ import annotations

import pytest
import torch

from harness.refit import tcp_stream
from harness.refit.staging import default_staging_dir
from harness.refit.zmq_stream import WeightManifestError, ipc_address
from suites.refit_stream import state_info, stream_in_thread


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sd = {f"layer{i}.w": torch.randn(i * 31 + 3, generator=gen) for i in range(12)}
    sd["embed"] = torch.randn(40, 50, generator=gen)  # 8000 bytes: oversized for a 4 KiB budget
    sd["half"] = torch.randn(17, generator=gen).to(torch.bfloat16)
    sd["ids"] = torch.arange(9, dtype=torch.int64)
    return sd


def _stream(address: str, sent: dict, buffer_size: int = 4096, timeout_ms: int = 10_000):
    """Stream ``sent`` from a thread to a receiver here; (received, receiver stats or error, sender outcome)."""
    outcome: dict = {}
    received: dict[str, torch.Tensor] = {}
    try:
        result, received, _ = stream_in_thread(address, sent, state_info(sent), buffer_size=buffer_size,
                                               timeout_ms=timeout_ms, outcome=outcome)
    except WeightManifestError as exc:
        result = exc
    return received, result, outcome


def _shm_files() -> set[str]:
    import os

    return {f for f in os.listdir(default_staging_dir()) if f.startswith("harness-refit-")}


def test_tcp_stream_is_bit_exact_with_the_ipc_stream_and_uses_no_shared_memory(tmp_path) -> None:
    sd = _state()
    via_ipc, ipc_stats, _ = _stream(ipc_address(str(tmp_path), "ref"), sd)
    before = _shm_files()
    [address] = tcp_stream.bind_endpoints(1, "127.0.0.1", 10_000)
    assert address.startswith("tcp://127.0.0.1:")
    seen_shm: list[set[str]] = []
    via_tcp, tcp_stats, outcome = _stream(address, sd)
    seen_shm.append(_shm_files())
    assert "error" not in outcome, outcome.get("error")
    assert list(via_tcp) == list(via_ipc) == list(sd) == tcp_stats.loaded
    for name, tensor in sd.items():  # bit-exact: same dtype, shape and bytes as sent and as over ipc://
        assert via_tcp[name].dtype == tensor.dtype and torch.equal(via_tcp[name], tensor), name
        assert torch.equal(via_tcp[name].view(torch.uint8), via_ipc[name].view(torch.uint8)), name
    # the same protocol: the same groups, the oversized tensor alone
    assert tcp_stats.groups == ipc_stats.groups == outcome["stats"].groups > 2
    assert outcome["stats"].oversized == 1
    assert seen_shm == [before]  # no staging file: the bytes went through the socket
    assert tcp_stream.take_bound(address) is None  # the stream took (and closed) its bound socket


def test_a_corrupted_tcp_payload_is_refused_after_complete_and_the_sender_finishes(monkeypatch) -> None:
    sd = _state()
    real = tcp_stream.InlineStagingBuffer.inline_handle

    def flip_a_byte(self, used):  # bytes damaged after the digest was taken (in transit)
        handle = real(self, used)
        if handle["nbytes"] > 600:
            data = bytearray(handle["data"])
            data[600] ^= 0x01
            handle["data"] = bytes(data)
        return handle

    monkeypatch.setattr(tcp_stream.InlineStagingBuffer, "inline_handle", flip_a_byte)
    [address] = tcp_stream.bind_endpoints(1, "127.0.0.1", 10_000)
    _, result, outcome = _stream(address, sd)
    assert isinstance(result, WeightManifestError)
    assert "payload digest" in str(result) and "corrupted in transit" in str(result)
    assert "error" not in outcome, outcome.get("error")  # every group was acknowledged


def test_open_inline_checks_size_and_digest() -> None:
    buffer = tcp_stream.InlineStagingBuffer.create(1024)
    buffer.tensor[:8] = torch.arange(8, dtype=torch.uint8)
    handle = buffer.inline_handle(8)
    assert tcp_stream.open_inline(handle).tolist() == list(range(8))
    with pytest.raises(RuntimeError, match="7 bytes received, the sender packed 8"):
        tcp_stream.open_inline({**handle, "data": handle["data"][:7]})
    with pytest.raises(RuntimeError, match="digest"):
        tcp_stream.open_inline({**handle, "data": bytes(8)})
    with pytest.raises(ValueError, match="2048 bytes used of a 1024-byte buffer"):
        buffer.inline_handle(2048)


def test_bound_sockets_not_streamed_are_closed() -> None:
    addresses = tcp_stream.bind_endpoints(2, "127.0.0.1", 1_000)
    assert len(set(addresses)) == 2
    assert tcp_stream.close_bound() == 2
    assert all(tcp_stream.take_bound(a) is None for a in addresses)
