"""Hypothesis properties of refit (docs/refit.md; PR #3612 helpers).

The stream-order properties run the real sender against a recording fake
socket (it plays the REP side: it snapshots each payload's staged bytes and
answers every send with an ACK), as NeMo RL's own unit tests do.
"""

from __future__ import annotations

import itertools
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
    for (names, used, _), (next_names, _, _) in itertools.pairwise(payloads):
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
    for b, nxt in itertools.pairwise(buckets):  # greedy: the next head did not fit
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


# -- per-sample handle aggregation ---------------------------------------------------


import pytest  # noqa: E402

from harness.refit.handles import aggregate_per_sample_handles  # noqa: E402


@st.composite
def dp_layouts(draw):
    """{dp_rank: samples} (ranks need not be contiguous) and replicas per DP rank."""
    ranks = draw(st.lists(st.integers(0, 9), unique=True, max_size=5))
    samples = {r: draw(st.integers(0, 5)) for r in ranks}
    replicas = draw(st.integers(1, 4))
    return samples, replicas


def _results(samples, replicas):
    """One result per (dp, replica) worker; a handle names (dp, sample, replica)."""
    return [
        {"dp_rank": dp, "per_sample_handles": [(dp, i, w) for i in range(n)]}
        for dp, n in samples.items()
        for w in range(replicas)
    ]


@given(dp_layouts(), st.randoms(use_true_random=False))
def test_handles_length_and_global_order(layout, rnd):
    samples, replicas = layout
    results = _results(samples, replicas)
    rnd.shuffle(results)  # worker order across DP ranks is arbitrary
    out = aggregate_per_sample_handles(results)
    assert len(out) == sum(samples.values())
    expected = [(dp, i) for dp in sorted(samples) for i in range(samples[dp])]
    assert [s["teacher_shards"][0][:2] for s in out] == expected
    for sample in out:
        assert len(sample["teacher_shards"]) == replicas
        assert len({h[:2] for h in sample["teacher_shards"]}) == 1  # one sample per entry


@given(dp_layouts(), st.randoms(use_true_random=False))
def test_handles_independent_of_order_across_dp_ranks(layout, rnd):
    samples, replicas = layout
    results = _results(samples, replicas)
    base = aggregate_per_sample_handles(results)
    # permute whole DP-rank blocks, keeping the relative order inside each rank
    blocks = {}
    for r in results:
        blocks.setdefault(r["dp_rank"], []).append(r)
    keys = list(blocks)
    rnd.shuffle(keys)
    interleaved = [r for k in keys for r in blocks[k]]
    assert aggregate_per_sample_handles(interleaved) == base
    # interleave the blocks too (only the within-rank order is meaningful)
    queues = {k: list(v) for k, v in blocks.items()}
    mixed = []
    while any(queues.values()):
        k = rnd.choice([k for k, q in queues.items() if q])
        mixed.append(queues[k].pop(0))
    assert aggregate_per_sample_handles(mixed) == base


@given(st.integers(0, 24), st.sampled_from([1, 2, 3, 4, 6]), st.integers(1, 3))
def test_handles_global_order_independent_of_dp_degree(n_global, dp, replicas):
    """The same global batch sharded contiguously over any DP degree aggregates alike."""
    n_global -= n_global % dp
    per = n_global // dp
    results = [
        {"dp_rank": d, "per_sample_handles": [("s", d * per + i, w) for i in range(per)]}
        for d in range(dp)
        for w in range(replicas)
    ]
    out = aggregate_per_sample_handles(results)
    assert [s["teacher_shards"][0][1] for s in out] == list(range(n_global))
    assert all([h[2] for h in s["teacher_shards"]] == list(range(replicas)) for s in out)


@given(dp_layouts(), st.randoms(use_true_random=False))
def test_shard_order_follows_input_order_within_a_rank(layout, rnd):
    samples, replicas = layout
    results = _results(samples, replicas)
    rnd.shuffle(results)
    order = {}
    for r in results:
        order.setdefault(r["dp_rank"], []).append(r["per_sample_handles"][0][2] if r["per_sample_handles"] else None)
    for sample in aggregate_per_sample_handles(results):
        dp = sample["teacher_shards"][0][0]
        assert [h[2] for h in sample["teacher_shards"]] == order[dp]


@given(dp_layouts(), st.data())
def test_length_mismatch_within_a_rank_raises(layout, data):
    samples, replicas = layout
    if not samples:
        samples = {0: 1}
    replicas = max(replicas, 2)
    results = _results(samples, replicas)
    victim = data.draw(st.sampled_from(results))
    if victim["per_sample_handles"] and data.draw(st.booleans()):
        victim["per_sample_handles"] = victim["per_sample_handles"][:-1]
    else:
        victim["per_sample_handles"] = victim["per_sample_handles"] + [("extra",)]
    with pytest.raises(AssertionError, match="per_sample_handles length mismatch"):
        aggregate_per_sample_handles(results)


@given(st.dictionaries(st.integers(0, 9), st.integers(0, 5), max_size=5))
def test_different_dp_ranks_may_differ_in_length(samples):
    out = aggregate_per_sample_handles(_results(samples, 2))
    assert len(out) == sum(samples.values())


def test_empty_input_is_empty():
    assert aggregate_per_sample_handles([]) == []
    assert aggregate_per_sample_handles(iter([])) == []
    # a rank whose workers all report no samples contributes nothing
    assert aggregate_per_sample_handles([{"dp_rank": 3, "per_sample_handles": []}] * 2) == []


@given(st.lists(st.integers(0, 64), max_size=20))
def test_engine_offsets_partition_the_device_axis(counts):
    """Non-negative counts: engine ranges [offset, offset+count) tile [0, sum) in order."""
    offsets = derive_engine_gpu_offsets(counts)
    covered = [d for o, c in zip(offsets, counts) for d in range(o, o + c)]
    assert covered == list(range(sum(counts)))
    assert derive_engine_gpu_offsets(tuple(counts)) == offsets  # any sequence
