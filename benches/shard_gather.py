"""The host refit export's gather, ``gather_object`` against ``gather_tagged``, side by side in one run.

    python3 benches/shard_gather.py [--ranks N] [--tensors K] [--repeats R]

``N`` spawned gloo ranks (one thread each) hold ``K`` tagged float32 tensors each (64 x
(32..32+K) elements, about the 2-rank multi-turn workload's owned shards) and gather them
to rank 0 both ways, alternating, ``R`` times per round over two rounds; rank 0 prints the
mean milliseconds of each and their ratio (harness.policy.shard_gather).
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness.parallel.rendezvous import RendezvousServer, join_rendezvous


def _rank(rank: int, world: int, port: int, tensors: int, repeats: int) -> None:
    from harness.policy.shard_gather import gather_tagged

    torch.set_num_threads(1)
    store = join_rendezvous("127.0.0.1", port, 120.0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    g = torch.Generator().manual_seed(rank)
    mine = [(f"p{i}", 0, rank, torch.randn(64, 32 + i, generator=g)) for i in range(tensors)]

    def with_gather_object():
        out = [None] * world if rank == 0 else None
        dist.gather_object(mine, out, dst=0)

    ways = {"gather_object": with_gather_object, "gather_tagged": lambda: gather_tagged(mine, dst=0)}
    totals = dict.fromkeys(ways, 0.0)
    for _ in range(2):
        for name, fn in ways.items():
            dist.barrier()
            t = time.perf_counter()
            for _ in range(repeats):
                fn()
            totals[name] += time.perf_counter() - t
    if rank == 0:
        ms = {name: 1000 * total / (2 * repeats) for name, total in totals.items()}
        for name, value in ms.items():
            print(f"{name:<14} {value:7.1f} ms a gather ({world} ranks, {tensors} tensors a rank)")
        print(f"gather_tagged / gather_object: {ms['gather_tagged'] / ms['gather_object']:.2f}")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tensors", type=int, default=70)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    held = RendezvousServer()
    try:
        mp.spawn(_rank, args=(args.ranks, held.port, args.tensors, args.repeats), nprocs=args.ranks)
    finally:
        held.close()


if __name__ == "__main__":
    main()
