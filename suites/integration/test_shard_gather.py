"""``gather_tagged`` gives rank 0 what ``dist.gather_object`` gives, bit for bit (harness.policy.shard_gather).

Three spawned gloo ranks hold lists of tagged CPU tensors of uneven counts and sizes (rank 2
holds none, one tensor is non-contiguous, one holds NaN and -0.0). Rank 0 gathers them
both ways and compares: the same structure, the same tags, every tensor bit-identical
(compared as raw bytes), each owning a storage of its own size (not a view into the
gather buffer). With one rank's tensors in float64 the dtypes differ, and the result
(taken through ``gather_object``) is still the same; the other ranks return ``None``.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch

from harness.parallel.rendezvous import RendezvousServer, join_rendezvous

pytestmark = pytest.mark.slow
WORLD = 3


def _tensors(rank: int, dtype: torch.dtype) -> list[tuple]:
    g = torch.Generator().manual_seed(rank)
    if rank == 2:
        return []
    out = [(f"layer{i}.w", i % 2 or None, rank, torch.randn(3 + i, 5 + rank, generator=g).to(dtype))
           for i in range(4 + rank)]
    special = torch.tensor([float("nan"), -0.0, 0.0, float("inf")], dtype=dtype)
    out.append(("special", None, rank, special))
    out.append(("transposed", 1, rank, torch.randn(4, 6, generator=g).to(dtype).t()))  # non-contiguous
    return out


def _same(a: list, b: list) -> list[str]:
    problems = []
    if len(a) != len(b):
        return [f"{len(a)} ranks vs {len(b)}"]
    for rank, (xs, ys) in enumerate(zip(a, b)):
        if [x[:-1] for x in xs] != [y[:-1] for y in ys]:
            problems.append(f"rank {rank}: tags differ")
            continue
        for x, y in zip(xs, ys):
            tx, ty = x[-1], y[-1]
            if tx.dtype != ty.dtype or tx.shape != ty.shape or \
                    tx.contiguous().view(torch.uint8).tolist() != ty.contiguous().view(torch.uint8).tolist():
                problems.append(f"rank {rank} {x[0]}: bits differ")
            if ty.untyped_storage().nbytes() != ty.numel() * ty.element_size():
                problems.append(f"rank {rank} {x[0]}: a view of a larger storage")
    return problems


def _rank(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from harness.policy.shard_gather import gather_tagged

    torch.set_num_threads(1)
    store = join_rendezvous("127.0.0.1", port, 120.0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    facts: dict = {"rank": rank}
    try:
        for case, dtype_of in (("one dtype", lambda r: torch.float32),
                               ("mixed dtypes", lambda r: torch.float64 if r == 1 else torch.float32)):
            mine = _tensors(rank, dtype_of(rank))
            want = [None] * WORLD if rank == 0 else None
            dist.gather_object(mine, want, dst=0)
            got = gather_tagged(mine, dst=0)
            facts[case] = _same(want, got) if rank == 0 else got is None
    except Exception as exc:  # noqa: BLE001 - reported to the test
        facts["error"] = repr(exc)
    finally:
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(facts))
        dist.destroy_process_group()


def test_gather_tagged_equals_gather_object_bit_for_bit(tmp_path):
    import torch.multiprocessing as mp

    held = RendezvousServer()
    try:
        mp.spawn(_rank, args=(held.port, str(tmp_path)), nprocs=WORLD)
    finally:
        held.close()
    facts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert not [f["error"] for f in facts if "error" in f]
    assert facts[0]["one dtype"] == [] and facts[0]["mixed dtypes"] == []
    assert all(f["one dtype"] is True and f["mixed dtypes"] is True for f in facts[1:])
