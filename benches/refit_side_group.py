"""Broadcast refit with one side group per session vs a new group per refit.

Members are threads of this process (one real ``ProcessGroupGloo`` each: the
sender and ``--receivers`` receivers) on one driver-held store. Per refit:

* ``rebuild``: every member builds a new group (a fresh store prefix per refit:
  what happened before, when every refit handed out a new port) and closes it;
* ``reuse``: every member keeps the group its ``SideGroupSlot`` built at the
  first refit (the session contract).

Weights: the reference model of a golden workload (default the smoke one).
Prints the median per-refit wall time of each and the ratio rebuild/reuse;
timing decides nothing (no assertion).

    python3 benches/refit_side_group.py [--refits 8] [--receivers 2] [--golden qwen3_moe_tiny_smoke]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.parallel.rendezvous import RendezvousServer
from harness.refit.broadcast import SideGroupSlot, broadcast_weights, receive_broadcast
from harness.spec import load_spec

BUFFER = 1 << 20


def _one_refit(store: RendezvousServer, slots: list[SideGroupSlot], weights: dict, prefix: str, close: bool) -> float:
    info = {n: (tuple(t.shape), t.dtype) for n, t in weights.items()}
    side = {"host": store.host, "port": store.port, "world_size": len(slots), "prefix": prefix}
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        try:
            group = slots[rank].join(rank=rank, **side)
            if rank == 0:
                broadcast_weights(weights.items(), group, buffer_size_bytes=BUFFER)
            else:
                receive_broadcast(group, state_dict_info=info, load_fn=lambda views: None, buffer_size_bytes=BUFFER)
            if close:
                slots[rank].close()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    t = time.perf_counter()
    threads = [threading.Thread(target=member, args=(r,)) for r in range(len(slots))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refits", type=int, default=8)
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--golden", default="qwen3_moe_tiny_smoke")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = load_spec(f"goldens/{args.golden}/workload.yaml")
    model = build_reference_model(ModelConfig.from_spec(spec["model"]), int(spec["seed"]))
    weights = {n: t.detach() for n, t in model.state_dict().items()}
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    store = RendezvousServer()
    try:
        times: dict[str, list[float]] = {"rebuild": [], "reuse": []}
        reuse_slots = [SideGroupSlot() for _ in range(1 + args.receivers)]
        for i in range(args.refits):  # interleaved, so both see the same box load
            rebuild_slots = [SideGroupSlot() for _ in range(1 + args.receivers)]
            times["rebuild"].append(_one_refit(store, rebuild_slots, weights, f"rebuild-{i}", close=True))
            times["reuse"].append(_one_refit(store, reuse_slots, weights, "reuse", close=False))
        for s in reuse_slots:
            s.close()
    finally:
        store.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"weights: {len(weights)} tensors, {nbytes / 1e6:.2f} MB; members: 1 sender + {args.receivers} receivers; "
          f"refits: {args.refits}")
    for k, v in times.items():
        print(f"{k:8s} median {med[k] * 1e3:8.2f} ms  min {min(v) * 1e3:8.2f} ms  first {v[0] * 1e3:8.2f} ms")
    print(f"ratio rebuild/reuse (median): {med['rebuild'] / med['reuse']:.2f}")


if __name__ == "__main__":
    main()
