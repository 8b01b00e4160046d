"""Hypothesis properties of refit (reference section 4.1 list, PR #3612 helpers).

The stream-order properties run the real sender against a recording fake
socket (it plays the REP side: it snapshots each payload's staged bytes and
answers every send with an ACK), as NeMo RL's own unit tests do.
"""

from __future__ import annotations

import pickle

import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.refit.buckets import calculate_aligned_size, iter_named_tensor_buckets, tensor_nbytes
from harness.refit.engine_offsets import derive_engine_gpu_offsets
from harness.refit.staging import open_staging
from harness.refit.zmq_stream import ACK, COMPLETE, send_weights_zmq

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.float16]


class RecordingSocket:
    """REP stand-in: records ``("send", payload)`` / ``("recv",)`` and copies staged bytes."""

    def __init__(self):
        self.events: list[tuple] = []
        self.payloads: list[tuple] = []  # (names, used_bytes, bytes snapshot)
        self._owed_acks = 0

    def send_pyobj(self, obj):
        assert self._owed_acks == 0, "two sends without an intervening recv"
        pickle.dumps(obj)  # must be picklable, as over a real socket
        self.events.append(("send", obj))
        if obj != COMPLETE:
            handle, names, used = obj
            self.payloads.append((list(names), used, open_staging(handle)[:used].clone()))
        self._owed_acks = 1

    def recv(self):
        assert self._owed_acks == 1, "recv without an outstanding send"
        self._owed_acks = 0
        self.events.append(("recv",))
        return ACK


@st.composite
def named_tensors(draw, max_tensors=12):
    count = draw(st.integers(0, max_tensors))
    out = []
    for i in range(count):
        dtype = draw(st.sampled_from(DTYPES))
        numel = draw(st.integers(0, 700))
        t = (torch.arange(numel, dtype=torch.int64) * (i + 7) % 251).to(dtype)
        if draw(st.booleans()) and numel >= 4 and numel % 2 == 0:
            t = t.view(2, -1).t()  # non-contiguous source
        out.append((f"p{i}", t))
    return out


def _send(pairs, buffer_size):
    socket = RecordingSocket()
    send_weights_zmq(pairs, address="ipc://unused", buffer_size_bytes=buffer_size, socket=socket)
    return socket


BUFFER = st.integers(64, 4096)


@given(named_tensors(), BUFFER)
def test_every_name_once_in_order(pairs, buffer_size):
    socket = _send(pairs, buffer_size)
    assert [n for names, _, _ in socket.payloads for n in names] == [n for n, _ in pairs]


@given(named_tensors(), BUFFER)
def test_used_bytes_is_sum_of_aligned_sizes_within_half(pairs, buffer_size):
    sizes = {n: calculate_aligned_size(tensor_nbytes(t)) for n, t in pairs}
    half = buffer_size // 2
    for names, used, _ in _send(pairs, buffer_size).payloads:
        assert used == sum(sizes[n] for n in names)
        assert used <= half or (len(names) == 1 and used == sizes[names[0]])


@given(named_tensors(), BUFFER)
def test_message_sequence_alternates_and_completes_last(pairs, buffer_size):
    events = _send(pairs, buffer_size).events
    kinds = [e[0] for e in events]
    assert kinds == ["send", "recv"] * (len(kinds) // 2) and len(kinds) % 2 == 0
    completes = [i for i, e in enumerate(events) if e[0] == "send" and e[1] == COMPLETE]
    assert completes == [len(events) - 2]


@given(named_tensors(), BUFFER)
def test_acks_consumed_equal_payloads_plus_one(pairs, buffer_size):
    socket = _send(pairs, buffer_size)
    assert sum(1 for e in socket.events if e[0] == "recv") == len(socket.payloads) + 1


@given(named_tensors(), BUFFER)
def test_bytes_round_trip_at_aligned_offsets(pairs, buffer_size):
    source = dict(pairs)
    for names, _, raw in _send(pairs, buffer_size).payloads:
        offset = 0
        for name in names:
            expected = source[name].contiguous().reshape(-1).view(torch.uint8)
            assert torch.equal(raw[offset : offset + expected.numel()], expected), name
            offset += calculate_aligned_size(expected.numel())


def test_empty_stream_is_complete_and_one_ack():
    events = _send([], 1024).events
    assert events == [("send", COMPLETE), ("recv",)]


@given(named_tensors(), BUFFER)
def test_grouping_is_greedy(pairs, buffer_size):
    """A group closes only when the next tensor would not fit (or is oversized)."""
    half = buffer_size // 2
    sizes = {n: calculate_aligned_size(tensor_nbytes(t)) for n, t in pairs}
    payloads = _send(pairs, buffer_size).payloads
    for (names, used, _), (next_names, _, _) in zip(payloads, payloads[1:]):
        nxt = sizes[next_names[0]]
        if used <= half and not (len(names) == 1 and sizes[names[0]] > half):
            assert used + nxt > half or nxt > half


# -- bucket iteration (PR #3612) ------------------------------------------------------


@given(named_tensors(), st.integers(1, 5000))
def test_bucket_invariants(pairs, limit):
    buckets = list(iter_named_tensor_buckets(pairs, limit))
    assert [n for b in buckets for n, _ in b] == [n for n, _ in pairs]
    for b in buckets:
        assert b, "empty bucket"
        size = sum(tensor_nbytes(t) for _, t in b)
        assert size <= limit or len(b) == 1
    for b, nxt in zip(buckets, buckets[1:]):  # greedy: the next head did not fit
        assert sum(tensor_nbytes(t) for _, t in b) + tensor_nbytes(nxt[0][1]) > limit


@given(st.integers(0, 10**9), st.sampled_from([1, 8, 256, 512, 4096]))
def test_aligned_size_properties(size, alignment):
    a = calculate_aligned_size(size, alignment)
    assert a >= size and a % alignment == 0 and a - size < alignment
    assert calculate_aligned_size(a, alignment) == a
    assert calculate_aligned_size(size + 1, alignment) >= a


@given(st.lists(st.integers(-5, 64), max_size=20))
def test_engine_offsets_properties(counts):
    offsets = derive_engine_gpu_offsets(counts)
    assert len(offsets) == len(counts)
    if counts:
        assert offsets[0] == 0
    for i in range(len(counts) - 1):
        assert offsets[i + 1] - offsets[i] == counts[i]
    if all(c >= 0 for c in counts):
        assert offsets == sorted(offsets)
