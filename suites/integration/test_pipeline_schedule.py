"""Pipeline schedules: the 1F1B op order per stage (pure) and a small gloo
world (pp=2/3/4, even and short microbatch counts) where 1F1B and GPipe must
give the single-process gradients and run the prescribed op order."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness.parallel.pipeline import (
    DEFAULT_SCHEDULE,
    gpipe_order,
    one_f_one_b_order,
    run_1f1b,
    run_pipeline,
    stage_info,
)


def _max_live(ops):
    live = peak = 0
    for kind, _ in ops:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def test_default_is_1f1b():
    assert DEFAULT_SCHEDULE == "1f1b"


def test_1f1b_order_pp2_four_microbatches():
    assert one_f_one_b_order(0, 2, 4) == [
        ("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert one_f_one_b_order(1, 2, 4) == [
        ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]


def test_1f1b_order_pp3_four_microbatches():
    assert one_f_one_b_order(0, 3, 4) == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    assert one_f_one_b_order(1, 3, 4) == [
        ("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert one_f_one_b_order(2, 3, 4) == [
        ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_1f1b_order_invariants(pp, n):
    for s in range(pp):
        ops = one_f_one_b_order(s, pp, n)
        fs = [m for k, m in ops if k == "F"]
        bs = [m for k, m in ops if k == "B"]
        assert fs == list(range(n)) and bs == list(range(n))
        for m in range(n):
            assert ops.index(("F", m)) < ops.index(("B", m))
        warm = min(pp - s - 1, n)
        assert ops[:warm] == [("F", m) for m in range(warm)]
        assert _max_live(ops) == min(pp - s, n) <= pp - s
        # steady state strictly alternates F, B after the warm-up
        steady = ops[warm : warm + 2 * (n - warm)]
        assert [k for k, _ in steady] == ["F", "B"] * (n - warm)
        assert _max_live(gpipe_order(s, pp, n)) == n


# -- gloo world --------------------------------------------------------------------

H = 6
SHAPE = (2, H)


def _weights(pp):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(H, H, generator=g) / H**0.5 for _ in range(pp)]


def _inputs(n):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(*SHAPE, generator=g) for _ in range(n)]


def _reference(pp, n):
    ws = [w.clone().requires_grad_(True) for w in _weights(pp)]
    for x in _inputs(n):
        for w in ws:
            x = torch.tanh(x @ w)
        (x.square().sum() / n).backward()
    return [w.grad for w in ws]


def _worker(rank, pp, n, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=pp)
    try:
        info = stage_info(list(range(pp)), rank, SHAPE, torch.float32)
        xs = _inputs(n)
        res = {}
        for schedule in ("1f1b", "gpipe"):
            w = _weights(pp)[rank].clone().requires_grad_(True)
            live, peak, ops = set(), [0], []

            # loop variables bound as defaults: the schedule calls these only within this iteration
            def fwd(m, x, w=w):
                y = torch.tanh((xs[m] if x is None else x) @ w)
                return y.square().sum() / n if info.is_last else y

            if schedule == "1f1b":
                def on_op(kind, m, ops=ops, live=live, peak=peak):
                    ops.append((kind, m))
                    (live.add if kind == "F" else live.discard)(m)
                    peak[0] = max(peak[0], len(live))

                run_1f1b(info, n, fwd, on_op=on_op)
            else:
                run_pipeline(info, n, fwd, backward=True, schedule="gpipe")
            res[schedule] = {"grad": w.grad.clone(), "ops": ops, "peak": peak[0]}
        # forward-only through the default schedule
        outs = run_pipeline(info, n, lambda m, x: (xs[m] if x is None else x) @ _weights(pp)[rank], backward=False)
        res["fwd"] = [o.clone() for o in outs]
        torch.save(res, os.path.join(out_dir, f"{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("pp,n", [(2, 4), (3, 4), (3, 2), (4, 5)])
def test_1f1b_gloo_matches_reference_and_order(pp, n):
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_worker, args=(pp, n, os.path.join(d, "init"), d), nprocs=pp,
                           join=True, start_method="fork")
        res = [torch.load(os.path.join(d, f"{r}.pt")) for r in range(pp)]
    ref = _reference(pp, n)
    for s in range(pp):
        assert res[s]["1f1b"]["ops"] == one_f_one_b_order(s, pp, n)
        assert res[s]["1f1b"]["peak"] <= pp - s
        for schedule in ("1f1b", "gpipe"):
            torch.testing.assert_close(res[s][schedule]["grad"], ref[s], rtol=1e-5, atol=1e-7)
    x_ref = _inputs(n)
    for w in _weights(pp):
        x_ref = [x @ w for x in x_ref]
    for got, want in zip(res[pp - 1]["fwd"], x_ref):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
