"""Run a policy world in plain `torch.multiprocessing` processes (no Ray): test and bench support.

`spawn_world` starts `world` spawned ranks, each initialises gloo, builds the engine
`spec.policy.backend` selects (`harness.registry.policy.create_engine`) and calls
`fn(engine, *args)`; results come back per rank. `with_layout` copies a spec with
other policy sizes; `checksums` summarises a state dict. The jobs the tests run on
each rank are in `suites/policy_jobs.py`; the train batch is
`harness.policy.synthetic.synthetic_batch`. Used by the integration and property
suites and by `benches/policy_step_bench.py`.
"""

from __future__ import annotations

import copy
import io
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.multiprocessing as mp

from harness.parallel.rendezvous import RendezvousServer
from harness.spec.typed import as_workload


def with_layout(spec: Mapping[str, Any], **policy: Any) -> dict[str, Any]:
    """A copy of `spec` with policy fields replaced (e.g. tp=2, pp=2)."""
    out = copy.deepcopy(dict(spec))
    out["policy"] = {**out["policy"], **policy}
    return out


def leave_spawned_rank() -> None:
    """End a spawned rank's process now with exit code 0; call it once the rank's result is on disk.

    At interpreter exit gloo's worker threads can still be joinable while C++ destructors
    run, and the process then aborts ("terminate called without an active exception",
    SIGABRT) after its work passed, which fails ``mp.spawn``. The harness's own rank
    processes leave the same way (``harness.runner.zygote``). Not for a result still in a
    ``multiprocessing`` queue's feeder thread: that would be lost.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def world_size(spec: Mapping[str, Any]) -> int:
    return as_workload(spec).policy.world_size


def _rank_main(rank: int, world: int, port: int, spec, fn, args, queue) -> None:
    import torch.distributed as dist

    from harness.policy.distributed import init_distributed
    from harness.registry.policy import create_engine

    try:
        init_distributed(rank, world, "127.0.0.1", port)
        engine = create_engine(as_workload(spec), rank)  # the backend spec.policy.backend selects
        result = fn(engine, *args)
        from harness.parallel import settle

        if settle.stats["timeouts"]:  # a collective kept a tensor: autograd's choices could vary
            raise RuntimeError(f"rank {rank}: {settle.stats['timeouts']} collective(s) kept a reference to "
                               f"their tensors past {settle.TIMEOUT_S} s (harness.parallel.settle)")
        buf = io.BytesIO()  # plain bytes: shared-memory tensors would die with this process
        torch.save(result, buf)
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        queue.put((rank, "error", f"{exc!r}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn_world(spec: Mapping[str, Any], fn: Callable[..., Any], *args: Any, timeout_s: float = 120.0) -> list[Any]:
    """Run `fn(engine, *args)` on every rank; returns results indexed by rank.
    `fn` must be a module-level function (it is pickled by reference).
    Raises RuntimeError naming the first failed rank."""
    world = world_size(spec)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    held = RendezvousServer()
    port = held.port
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, spec, fn, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        for _ in range(world):
            rank, status, payload = queue.get(timeout=timeout_s)
            if status == "ok":
                results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors[rank] = payload
            if errors:
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 1)
            if p.is_alive():
                p.kill()
                p.join()
        held.close()
    if errors:
        rank = min(errors)
        raise RuntimeError(f"policy rank {rank} failed: {errors[rank]}")
    return [results[r] for r in range(world)]


def checksums(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[float, float, float]]:
    """{name: (sum, sum of squares, sum of |x|)} in float64."""
    return {
        k: (float(v.double().sum()), float(v.double().pow(2).sum()), float(v.double().abs().sum()))
        for k, v in state.items()
    }
