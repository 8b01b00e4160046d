"""Teacher logits by CPU shared memory across processes: two spawned teacher DP ranks write
their logits into their own buffers (grown once), hand per-sample handles to this process,
which aggregates them into the global batch and reads every sample without a copy.

The CUDA IPC form has the same interface; its test needs a CUDA device (marked gpu).
"""

from __future__ import annotations

import pytest
import torch

from harness.distill.teacher_ipc import (
    aggregate_teacher_handles,
    ensure_teacher_ipc_buffer,
    per_sample_handles,
    read_sample,
    teacher_view,
)

pytestmark = pytest.mark.slow

DP, N_MB, B, T, V = 2, 2, 3, 4, 5


def _logits(global_sample: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + global_sample)
    return torch.randn(T, V, generator=g).to(torch.bfloat16)


def _teacher(dp_rank: int, results, done) -> None:
    torch.set_num_threads(1)
    # a first, smaller step, then the real one: the buffer grows once and is re-exported
    storage, handle = ensure_teacher_ipc_buffer(None, None, 1, B, T - 1, V, torch.bfloat16, "cpu")
    first = handle
    storage, handle = ensure_teacher_ipc_buffer(storage, handle, N_MB, B, T, V, torch.bfloat16, "cpu")
    view = teacher_view(storage, N_MB, B, T, V)
    per_rank = N_MB * B
    for m in range(N_MB):
        for r in range(B):
            view[m, r] = _logits(dp_rank * per_rank + m * B + r)
    results.put({"dp_rank": dp_rank, "per_sample_handles": per_sample_handles(handle, N_MB, B, T, V),
                 "regrown": handle != first})
    done.wait(120)  # the buffer must outlive the reader's open


def test_teacher_logits_reach_the_student_in_global_batch_order():
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results, done = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_teacher, args=(k, results, done)) for k in reversed(range(DP))]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=120) for _ in range(DP)]
        assert all(r.pop("regrown") for r in got)
        batch = aggregate_teacher_handles(got)
        assert len(batch) == DP * N_MB * B
        opened: dict = {}
        for i, entry in enumerate(batch):
            (ref,) = entry["teacher_shards"]
            assert torch.equal(read_sample(ref, opened), _logits(i)), f"global sample {i}"
        assert len(opened) == DP  # one open per teacher buffer, not per sample
    finally:
        done.set()
        for p in procs:
            p.join(60)
    assert [p.exitcode for p in procs] == [0] * DP


def _cuda_teacher(results, done) -> None:
    storage, handle = ensure_teacher_ipc_buffer(None, None, 1, B, T, V, torch.bfloat16, "cuda")
    storage, handle = ensure_teacher_ipc_buffer(storage, handle, N_MB, B, T, V, torch.bfloat16, "cuda")
    view = teacher_view(storage, N_MB, B, T, V)
    for m in range(N_MB):
        for r in range(B):
            view[m, r] = _logits(m * B + r).cuda()
    torch.cuda.synchronize()
    results.put({"dp_rank": 0, "per_sample_handles": per_sample_handles(handle, N_MB, B, T, V)})
    done.wait(120)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a CUDA device")
def test_cuda_ipc_teacher_logits_are_read_in_another_process():
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results, done = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_cuda_teacher, args=(results, done))
    proc.start()
    try:
        got = results.get(timeout=120)
        assert {r.handle.kind for r in got["per_sample_handles"]} == {"cuda_ipc"}
        opened: dict = {}
        for i, entry in enumerate(aggregate_teacher_handles([got])):
            (ref,) = entry["teacher_shards"]
            sample = read_sample(ref, opened)
            assert sample.is_cuda and torch.equal(sample.cpu(), _logits(i)), f"sample {i}"
        opened.clear()
    finally:
        done.set()
        proc.join(60)
    assert proc.exitcode == 0
