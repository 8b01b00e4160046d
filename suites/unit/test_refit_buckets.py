"""Refit building blocks: aligned sizes, buckets, packing, engine offsets."""

from __future__ import annotations

import pytest
import torch

from harness.refit.buckets import calculate_aligned_size, iter_named_tensor_buckets
from harness.refit.engine_offsets import derive_engine_gpu_offsets
from harness.refit.packing import pack, packed_size, unpack_views


def test_aligned_size_reference_examples():
    assert calculate_aligned_size(2048) == 2048
    assert calculate_aligned_size(2049) == 2560
    assert calculate_aligned_size(0) == 0
    assert calculate_aligned_size(1) == 512
    assert calculate_aligned_size(10, alignment=8) == 16


def test_aligned_size_rejects_bad_input():
    with pytest.raises(ValueError, match="alignment"):
        calculate_aligned_size(10, alignment=0)
    with pytest.raises(ValueError, match="size_bytes"):
        calculate_aligned_size(-1)


def test_buckets_greedy_in_order_with_oversized_alone():
    tensors = [("a", torch.zeros(10)), ("b", torch.zeros(10)), ("big", torch.zeros(100)), ("c", torch.zeros(5))]
    buckets = [[n for n, _ in b] for b in iter_named_tensor_buckets(tensors, 80)]
    assert buckets == [["a", "b"], ["big"], ["c"]]


def test_buckets_reject_non_positive_limit():
    for bad in (0, -5):
        with pytest.raises(ValueError, match="buffer_size_bytes"):
            list(iter_named_tensor_buckets([("a", torch.zeros(1))], bad))


def test_buckets_wait_on_async_tensors():
    class Pending:
        def __init__(self, t):
            self.t, self.waited = t, False

        def wait(self):
            self.waited = True
            return self.t

    pending = Pending(torch.zeros(4))
    (bucket,) = list(iter_named_tensor_buckets([("p", pending)], 1024))
    assert pending.waited and bucket[0][1] is pending.t


def test_pack_roundtrip_mixed_dtypes_and_non_contiguous():
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=gen)
    tensors = {
        "t": base.t(),  # non-contiguous
        "bf16": torch.randn(33, generator=gen).to(torch.bfloat16),
        "int": torch.arange(7, dtype=torch.int64),
        "empty": torch.zeros(0, 3),
    }
    buffer = pack(list(tensors.values()))
    assert buffer.numel() == packed_size(list(tensors.values())) and buffer.numel() % 512 == 0
    info = {n: (tuple(t.shape), t.dtype) for n, t in tensors.items()}
    views = dict(unpack_views(buffer, list(tensors), info, buffer.numel()))
    for name, t in tensors.items():
        assert torch.equal(views[name], t), name


def test_unpack_detects_metadata_disagreement():
    buffer = pack([torch.zeros(200)])
    with pytest.raises(RuntimeError, match="'w'.*implies"):
        unpack_views(buffer, ["w"], {"w": ((100,), torch.float32)}, buffer.numel() + 512)


def test_engine_offsets_are_exclusive_prefix_sums():
    assert derive_engine_gpu_offsets([2, 2, 4]) == [0, 2, 4]
    assert derive_engine_gpu_offsets([]) == []
    assert derive_engine_gpu_offsets([0, 3, -1]) == [0, 0, 3]
