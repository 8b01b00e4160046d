"""Colocated refit throughput on one GPU: host-staged vs CUDA IPC, side by side in one run.

The medium model's full HF-named weights (``qwen3_moe_medium_vllm``: 646M fp32
parameters, 2.6 GB; random values, same names and shapes) stream from this
process to a receiver process on the same GPU over the ZMQ ping-pong protocol
(``harness.refit.zmq_stream``). The receiver copies every group into its own
device tensors, as the native engine's ``load_weights`` does. Arms
(``--arms``, each ``staging:source:budget``):

* ``host:cuda:64K`` -- today's cuda path at the goldens' 64 KiB budget: pack
  device -> host shared memory, the receiver copies host -> device;
* ``host:cuda:512M`` -- the same with a 512 MiB budget;
* ``ipc:cuda:64K`` / ``ipc:cuda:512M`` -- CUDA IPC staging, weights on the GPU;
* ``ipc:cpu:512M`` -- CUDA IPC staging fed from host tensors (what the policy's
  ``hf_state_dict`` hands over today: it returns host copies).

Prints GB/s per arm (median of ``--repeat``; 64 KiB arms run once) and checks
that the receiver holds the sender's bytes after the last arm.

    python3 benches/refit_cuda_ipc_bench.py                     # on a GPU machine
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time

import torch

BUDGETS = {"64K": 64 << 10, "1M": 1 << 20, "64M": 64 << 20, "512M": 512 << 20, "1G": 1 << 30}
DEFAULT_ARMS = "host:cuda:64K,host:cuda:512M,ipc:cuda:64K,ipc:cuda:512M,ipc:cpu:512M"


def _shapes(workload: str) -> dict[str, tuple[int, ...]]:
    from harness.model.config import ModelConfig
    from harness.rollout.sharding import hf_weight_shapes
    from harness.spec.load import load_spec

    return {n: tuple(s) for n, s in hf_weight_shapes(ModelConfig.from_spec(load_spec(workload)["model"])).items()}


def _receiver(shapes: dict, jobs, results) -> None:
    from harness.refit.zmq_stream import receive_weights_zmq

    torch.cuda.set_device(0)
    dest = {n: torch.empty(s, dtype=torch.float32, device="cuda") for n, s in shapes.items()}
    info = {n: (s, torch.float32) for n, s in shapes.items()}

    def load(views):
        for name, view in views:
            dest[name].copy_(view)

    while True:
        job = jobs.get()
        if job is None:
            break
        if job == "digest":
            results.put({n: float(t.double().sum()) for n, t in dest.items()})
            continue
        t = time.perf_counter()
        receive_weights_zmq(address=job, state_dict_info=info, load_fn=load, timeout_ms=300_000)
        torch.cuda.synchronize()
        results.put(time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="qwen3_moe_medium_vllm")
    ap.add_argument("--arms", default=DEFAULT_ARMS)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("refit_cuda_ipc_bench: needs a CUDA device")
    from harness.refit.zmq_stream import ipc_address, send_weights_zmq

    shm = "/dev/shm"
    if not os.path.isdir(shm) or shutil.disk_usage(shm).free < (1200 << 20):
        os.environ["HARNESS_REFIT_STAGING_DIR"] = tempfile.gettempdir()  # a small /dev/shm cannot hold 512 MiB halves
    torch.cuda.set_device(0)
    shapes = _shapes(args.workload)
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = {n: torch.randn(s, generator=gen, device="cuda") for n, s in shapes.items()}
    host = {n: t.cpu() for n, t in weights.items()}
    total = sum(t.numel() * t.element_size() for t in weights.values())
    print(f"{len(weights)} tensors, {total / 1e9:.3f} GB fp32; staging dir "
          f"{os.environ.get('HARNESS_REFIT_STAGING_DIR', shm)}; GPU {torch.cuda.get_device_name(0)}")
    ctx = mp.get_context("spawn")
    jobs, results = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_receiver, args=(shapes, jobs, results), daemon=True)
    child.start()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n_arm, arm in enumerate(args.arms.split(",")):
            staging, source, budget = arm.split(":")
            items = list((weights if source == "cuda" else host).items())
            repeat = 1 if BUDGETS[budget] < (1 << 20) else args.repeat
            times, recv = [], []
            for i in range(repeat):
                address = ipc_address(tmp, f"a{n_arm}r{i}")
                jobs.put(address)
                t = time.perf_counter()
                stats = send_weights_zmq(items, address=address, buffer_size_bytes=BUDGETS[budget],
                                         timeout_ms=300_000,
                                         staging_device="cuda" if staging == "ipc" else None)
                times.append(time.perf_counter() - t)
                recv.append(results.get(timeout=600))
            med = statistics.median(times)
            rows.append((arm, total / med / 1e9, med, stats.groups, statistics.median(recv)))
            print(f"{arm:16s} {total / med / 1e9:8.2f} GB/s  {med:8.3f} s  {stats.groups:6d} groups  "
                  f"(receiver {statistics.median(recv):.3f} s; runs {[round(x, 3) for x in times]})", flush=True)
        jobs.put("digest")
        digest = results.get(timeout=600)
        jobs.put(None)
        child.join(60)
    want = {n: float(t.double().sum()) for n, t in weights.items()}
    bad = [n for n in want if digest[n] != want[n]]
    print("receiver holds the sender's weights: " + ("yes" if not bad else f"NO ({len(bad)} differ, e.g. {bad[:3]})"))
    base = {a: g for a, g, *_ in rows}
    if "host:cuda:64K" in base:
        for arm, gbs, *_ in rows:
            print(f"{arm:16s} {gbs / base['host:cuda:64K']:9.1f}x host:cuda:64K")


if __name__ == "__main__":
    main()
