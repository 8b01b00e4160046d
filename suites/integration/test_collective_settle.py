"""gloo collectives return only once gloo let go of their tensors (harness.parallel.settle).

Without the wrappers, a tensor handed to a blocking gloo collective is still
referenced by gloo's worker thread for a moment after the call returns (2-4
references instead of 1 in ~30% of calls here; the same for funcol's
``wait_tensor``, which DTensor's redistributes wait on, in ~10% of waits), which made autograd's in-place
choices (``aten::add_`` vs ``aten::add``) and so a golden's operator surface
depend on thread timing. Real 2-rank gloo jobs (torch.multiprocessing).
"""

from __future__ import annotations

import ast
import collections
import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp

from suites.local_world import leave_spawned_rank

pytestmark = pytest.mark.slow

ITERATIONS = 1500


def _counts_after_collectives(rank: int, store_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    from harness.parallel import settle
    from harness.parallel.pipeline import _exchange

    wrapped = settle.install()
    assert settle.install() == wrapped  # idempotent
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    group = dist.group.WORLD
    seen: collections.Counter = collections.Counter()
    x = torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4)
    for _ in range(ITERATIONS):
        out = torch.empty(64, 4)
        dist.all_to_all_single(out, x, [32, 32], [32, 32])
        seen["all_to_all_single", out._use_count()] += 1
        y = torch.ones(8)
        dist.all_reduce(y)
        seen["all_reduce", y._use_count()] += 1
        g = torch.empty(16)
        dist.all_gather_into_tensor(g, torch.ones(8))
        seen["all_gather_into_tensor", g._use_count()] += 1
        r = torch.empty(4)
        dist.reduce_scatter_tensor(r, torch.ones(8))
        seen["reduce_scatter_tensor", r._use_count()] += 1
        f = funcol.all_reduce(torch.ones(8), "sum", group).wait()  # DTensor's path (dispatcher, not dist.*)
        seen["funcol_all_reduce", f._use_count()] += 1
        send, recv = torch.full((16,), float(rank)), torch.empty(16)
        _exchange(send, 1 - rank, recv, 1 - rank)
        seen["exchange", recv._use_count()] += 1
        assert recv[0].item() == float(1 - rank)
    work = dist.all_reduce(torch.ones(4), async_op=True)  # async calls are not waited on here
    assert isinstance(work, dist.Work)
    work.wait()
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as fh:
        fh.write(repr({f"{op}:{count}": n for (op, count), n in sorted(seen.items())}))
    leave_spawned_rank()


def test_collectives_release_their_tensors_before_returning(tmp_path):
    mp.spawn(_counts_after_collectives, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        seen = ast.literal_eval((tmp_path / f"rank{rank}.txt").read_text())  # our own repr
        expected = {f"{op}:1": ITERATIONS for op in
                    ("all_gather_into_tensor", "all_reduce", "all_to_all_single", "exchange", "funcol_all_reduce",
                     "reduce_scatter_tensor")}
        assert seen == expected, f"rank {rank}: tensors still referenced after the call: {seen}"


def test_wrappers_keep_the_torch_signature():
    from harness.parallel import settle

    settle.install()
    assert dist.all_reduce.__name__ == "all_reduce" and dist.all_reduce.__harness_settled__
    assert "async_op" in str(__import__("inspect").signature(dist.all_reduce))
    assert funcol.wait_tensor.__harness_settled__ and funcol.wait_tensor.__name__ == "wait_tensor"
    a, b = torch.ones(1), torch.ones(2)
    found = settle.cpu_tensors([a, [b, 3], "x"])
    assert len(found) == 2 and found[0] is a and found[1] is b  # top level and inside lists, nothing else
