"""Hypothesis properties of the teacher-logits IPC buffer and handle aggregation (harness.distill).

Growth: a sequence of requests is replayed against a model of the rule (keep
while it fits; else the elementwise max, or exactly the request after a dtype
change), with real CPU shared-memory buffers: a handle changes exactly when
the buffer does, and opening it aliases the buffer. Aggregation: teacher
workers of any DP degree and any TP x CP replica count, in any order, give the
global batch in order.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.distill.teacher_ipc import (
    aggregate_teacher_handles,
    ensure_teacher_ipc_buffer,
    open_teacher_handle,
    per_sample_handles,
    teacher_view,
)

MORE = settings(max_examples=max(150, settings().max_examples))
DTYPES = [torch.float32, torch.bfloat16]
requests = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 5), st.integers(1, 6),
                     st.sampled_from(DTYPES))


@settings(max_examples=max(80, settings().max_examples))
@given(st.lists(requests, min_size=1, max_size=8))
def test_the_buffer_grows_only_when_a_request_does_not_fit(seq):
    storage = handle = None
    model_shape = model_dtype = None
    reallocs = 0
    for *dims, dtype in seq:
        new_storage, new_handle = ensure_teacher_ipc_buffer(storage, handle, *dims, dtype, "cpu")
        fits = model_shape is not None and model_dtype == dtype and all(h >= n for h, n in zip(model_shape, dims))
        if fits:
            assert new_storage is storage and new_handle is handle  # unchanged, nothing re-exported
        else:
            assert new_storage is not storage and new_handle != handle
            model_shape = (tuple(max(h, n) for h, n in zip(model_shape, dims))
                           if model_shape is not None and model_dtype == dtype else tuple(dims))
            model_dtype = dtype
            reallocs += 1
            assert new_storage.is_shared() and new_handle.shape == model_shape
            opened = open_teacher_handle(new_handle)  # aliases the buffer: a write shows through
            opened.view(-1)[-1] = 7.0
            assert new_storage.view(-1)[-1].item() == 7.0 and opened.dtype == dtype
        storage, handle = new_storage, new_handle
        assert tuple(storage.shape) == model_shape and storage.dtype == dtype
        assert tuple(teacher_view(storage, *dims).shape) == tuple(dims)
    # never more reallocations than requests that changed dtype or exceeded the running maximum
    assert 1 <= reallocs <= len(seq)


@MORE
@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_aggregation_gives_the_global_batch_in_order_for_any_teacher_dp_degree(dp, replicas, data):
    per_rank = data.draw(st.integers(0, 5))
    gbs = dp * per_rank
    workers = [{"dp_rank": k, "per_sample_handles": [(k * per_rank + i, rep) for i in range(per_rank)]}
               for k in range(dp) for rep in range(replicas)]
    order = data.draw(st.permutations(range(len(workers))))
    shuffled = [workers[i] for i in order]
    out = aggregate_teacher_handles(shuffled)
    assert len(out) == gbs
    for i, entry in enumerate(out):
        shards = entry["teacher_shards"]
        assert [s[0] for s in shards] == [i] * replicas  # all TP x CP shards of global sample i
        rank = i // per_rank
        want = [w["per_sample_handles"][0][1] for w in shuffled if w["dp_rank"] == rank]
        assert [s[1] for s in shards] == want  # shards in input order of that rank's workers


@MORE
@given(st.integers(1, 12), st.integers(1, 4), st.data())
def test_the_order_does_not_depend_on_the_teacher_dp_degree(per_degree, replicas, data):
    """One global batch, split over two DP degrees that divide it: the same sample sequence."""
    d1, d2 = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    gbs = d1 * d2 * per_degree

    def results(dp: int) -> list[dict]:
        n = gbs // dp
        return [{"dp_rank": k, "per_sample_handles": [f"s{k * n + i}" for i in range(n)]}
                for k in reversed(range(dp)) for _ in range(replicas)]

    seq = [sorted(set(e["teacher_shards"])) for e in aggregate_teacher_handles(results(d1))]
    assert seq == [sorted(set(e["teacher_shards"])) for e in aggregate_teacher_handles(results(d2))]
    assert seq == [[f"s{i}"] for i in range(gbs)]


@given(st.integers(1, 4), st.integers(1, 4))
def test_per_sample_handles_are_microbatch_major(n_mb, b):
    _, handle = ensure_teacher_ipc_buffer(None, None, n_mb, b, 2, 3, torch.float32, "cpu")
    refs = per_sample_handles(handle, n_mb, b, 2, 3)
    assert [(r.microbatch, r.row) for r in refs] == [(m, r) for m in range(n_mb) for r in range(b)]
    assert all(r.handle == handle and (r.seq_len, r.vocab) == (2, 3) for r in refs)
