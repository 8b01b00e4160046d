"""Colocated refit throughput on one GPU: host-staged vs CUDA IPC, side by side in one run.

The medium model's full HF-named weights (``qwen3_moe_medium_vllm``: 646M fp32
parameters, 2.6 GB; random values, same names and shapes) stream from this
process to a receiver process on the same GPU over the ZMQ ping-pong protocol
(``harness.refit.zmq_stream``). The receiver copies every group into its own
device tensors. Arms (``--arms``, each ``staging:source:budget[+flag...]``):

* ``host:cuda:64K`` -- the old cuda path at a 64 KiB budget: pack device ->
  host shared memory, the receiver copies host -> device;
* ``host:cuda:512M`` -- the same with a 512 MiB budget (the medium golden's);
* ``ipc:cuda:64K`` / ``ipc:cuda:512M`` / ``ipc:cuda:1G`` -- CUDA IPC staging,
  weights on the GPU (what the workload does on cuda);
* ``ipc:cpu:512M`` -- CUDA IPC staging fed from host tensors;
* flag ``+loop`` -- the sender packs with one ``copy_`` per tensor (the code
  before ``pack_into(batched=...)``) instead of one ``_foreach_copy_`` per
  dtype; flag ``+fe`` -- the receiver loads a group with one
  ``_foreach_copy_`` instead of one ``copy_`` per tensor (the default
  receiver is per tensor, as the native engine's ``load_weights``).

Per arm: GB/s (the sender's wall time of ``send_weights_zmq``, socket
bind and the receiver's connect included; median of ``--repeat``, 64 KiB
arms once), and where the time of the median run went, summed over groups:
sender ``pack`` (host time issuing the copies), ``ready`` (the wait for them
before a handle goes out), ``ack`` (waiting for the receiver), ``send``;
receiver ``open`` (mapping a buffer: CUDA IPC opens), ``unpack`` (views),
``load``, ``settle`` (the wait for its copies before the ACK). ``--floor``
also times plain device copies of all the bytes (one and two passes, same
tensors): what bandwidth alone would allow. Checks that the receiver holds
the sender's bytes after the last arm; ``--out`` writes the rows as JSON.

    python3 benches/refit_cuda_ipc_bench.py --floor --out /tmp/refit_bench.json   # on a GPU machine
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

BUDGETS = {"64K": 64 << 10, "1M": 1 << 20, "64M": 64 << 20, "512M": 512 << 20, "1G": 1 << 30, "2G": 2 << 30}
DEFAULT_ARMS = ("host:cuda:64K,host:cuda:512M,ipc:cuda:64K,ipc:cuda:512M+loop,ipc:cuda:512M,"
                "ipc:cuda:512M+fe,ipc:cuda:1G+fe,ipc:cpu:512M")


def _shapes(workload: str) -> dict[str, tuple[int, ...]]:
    from harness.model.config import ModelConfig
    from harness.rollout.sharding import hf_weight_shapes
    from harness.spec.load import load_spec

    return {n: tuple(s) for n, s in hf_weight_shapes(ModelConfig.from_spec(load_spec(workload)["model"])).items()}


class _Clock:
    """Seconds per named phase, summed (one instance per process and run)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t
        return timed


class _TimedSocket:
    """A ZMQ socket whose send/recv calls are timed (the rest passes through)."""

    def __init__(self, socket, clock: _Clock, recv_name: str, send_name: str) -> None:
        self._socket = socket
        self.recv = clock.wrap(recv_name, socket.recv)
        self.recv_pyobj = clock.wrap(recv_name, socket.recv_pyobj)
        self.send = clock.wrap(send_name, socket.send)
        self.send_pyobj = clock.wrap(send_name, socket.send_pyobj)

    def close(self, linger: int = 0) -> None:
        self._socket.close(linger=linger)


def _instrument(clock: _Clock, *, loop_pack: bool = False):
    """Time the stream's phases in this process; returns a function that undoes it."""
    from harness.refit import packing, staging, zmq_receiver, zmq_sender

    saved = [(zmq_sender, "pack_into", zmq_sender.pack_into),
             (zmq_receiver, "unpack_views", zmq_receiver.unpack_views),
             (zmq_receiver, "open_staging", zmq_receiver.open_staging),
             (zmq_receiver._OpenedBuffers, "settle", zmq_receiver._OpenedBuffers.__dict__["settle"]),
             (staging.CudaStagingBuffer, "ready", staging.CudaStagingBuffer.ready),
             (staging.StagingBuffer, "ready", staging.StagingBuffer.ready)]
    pack = functools.partial(packing.pack_into, batched=False) if loop_pack else packing.pack_into
    zmq_sender.pack_into = clock.wrap("pack", pack)
    zmq_receiver.unpack_views = clock.wrap("unpack", packing.unpack_views)
    zmq_receiver.open_staging = clock.wrap("open", staging.open_staging)
    zmq_receiver._OpenedBuffers.settle = staticmethod(clock.wrap("settle", zmq_receiver._OpenedBuffers.settle))
    staging.CudaStagingBuffer.ready = clock.wrap("ready", staging.CudaStagingBuffer.ready)
    staging.StagingBuffer.ready = clock.wrap("ready", staging.StagingBuffer.ready)

    def undo() -> None:
        for owner, name, value in saved:
            setattr(owner, name, value)
    return undo


def _receiver(shapes: dict, device: str, jobs, results) -> None:
    import zmq

    from harness.refit.zmq_stream import make_socket, receive_weights_zmq

    if device == "cuda":
        torch.cuda.set_device(0)
    dest = {n: torch.empty(s, dtype=torch.float32, device=device) for n, s in shapes.items()}
    info = {n: (s, torch.float32) for n, s in shapes.items()}

    def load_each(views):
        for name, view in views:
            dest[name].copy_(view)

    def load_foreach(views):
        torch._foreach_copy_([dest[name] for name, _ in views], [view for _, view in views])

    results.put("ready")  # the arms time streams, not this process's start
    while True:
        job = jobs.get()
        if job is None:
            break
        if job == "digest":
            results.put({n: float(t.double().sum()) for n, t in dest.items()})
            continue
        address, foreach = job
        clock = _Clock()
        undo = _instrument(clock)
        load = clock.wrap("load", load_foreach if foreach else load_each)
        t = time.perf_counter()
        socket = _TimedSocket(make_socket(zmq.REP, address, 300_000, bind=False), clock, "wait", "ack")
        try:
            receive_weights_zmq(address=address, state_dict_info=info, load_fn=load, timeout_ms=300_000,
                                socket=socket)
        finally:
            socket.close(linger=0)
            undo()
        if device == "cuda":
            torch.cuda.synchronize()
        results.put({"seconds": time.perf_counter() - t, "phases": dict(clock.seconds)})


def _floor(weights: dict[str, torch.Tensor], total: int) -> dict[str, float]:
    """Plain device copies of every tensor into one buffer (one pass) and back out (two passes)."""
    flat = torch.empty(total // 4, dtype=torch.float32, device="cuda")
    srcs = [t.reshape(-1) for t in weights.values()]
    views, offset = [], 0
    for t in srcs:
        views.append(flat[offset:offset + t.numel()])
        offset += t.numel()
    dests = [torch.empty_like(t) for t in srcs]
    out = {}
    for name, passes in (("one_pass", [(views, srcs)]), ("two_passes", [(views, srcs), (dests, views)])):
        best = float("inf")
        for _ in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for dst, src in passes:
                torch._foreach_copy_(dst, src)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        out[name] = total / best / 1e9
    del flat, dests
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="qwen3_moe_medium_vllm")
    ap.add_argument("--arms", default=DEFAULT_ARMS)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--floor", action="store_true", help="also time plain device copies of the same bytes")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a dry run of the bench itself (host arms with source cpu only)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("refit_cuda_ipc_bench: needs a CUDA device")
    import zmq

    from harness.refit.zmq_stream import ipc_address, make_socket, send_weights_zmq

    shm = "/dev/shm"
    if not os.path.isdir(shm) or shutil.disk_usage(shm).free < (1200 << 20):
        os.environ["HARNESS_REFIT_STAGING_DIR"] = tempfile.gettempdir()  # a small /dev/shm cannot hold 512 MiB halves
    if args.device == "cuda":
        torch.cuda.set_device(0)
    shapes = _shapes(args.workload)
    gen = torch.Generator(device=args.device).manual_seed(0)
    weights = {n: torch.randn(s, generator=gen, device=args.device) for n, s in shapes.items()}
    host = {n: t.cpu() for n, t in weights.items()}
    total = sum(t.numel() * t.element_size() for t in weights.values())
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "none"
    report: dict = {"tensors": len(weights), "bytes": total, "gpu": gpu,
                    "torch": torch.__version__, "staging_dir": os.environ.get("HARNESS_REFIT_STAGING_DIR", shm)}
    print(f"{len(weights)} tensors, {total / 1e9:.3f} GB fp32; staging dir {report['staging_dir']}; "
          f"GPU {report['gpu']}")
    if args.floor:
        report["floor_gb_s"] = _floor(weights, total)
        print("device copies alone: " + ", ".join(f"{k} {v:.0f} GB/s" for k, v in report["floor_gb_s"].items()))
    ctx = mp.get_context("spawn")
    jobs, results = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_receiver, args=(shapes, args.device, jobs, results), daemon=True)
    child.start()
    if results.get(timeout=600) != "ready":
        raise SystemExit("refit_cuda_ipc_bench: the receiver did not start")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n_arm, arm in enumerate(args.arms.split(",")):
            base, *flags = arm.split("+")
            staging, source, budget = base.split(":")
            items = list((weights if source == "cuda" else host).items())
            repeat = 1 if BUDGETS[budget] < (1 << 20) else args.repeat
            runs = []
            for i in range(repeat):
                address = ipc_address(tmp, f"a{n_arm}r{i}")
                jobs.put((address, "fe" in flags))
                clock = _Clock()
                undo = _instrument(clock, loop_pack="loop" in flags)
                t = time.perf_counter()
                socket = _TimedSocket(make_socket(zmq.REQ, address, 300_000, bind=True), clock, "ack", "send")
                try:
                    stats = send_weights_zmq(items, address=address, buffer_size_bytes=BUDGETS[budget],
                                             timeout_ms=300_000, socket=socket,
                                             staging_device="cuda" if staging == "ipc" else None)
                finally:
                    socket.close(linger=0)
                    undo()
                seconds = time.perf_counter() - t
                runs.append({"seconds": seconds, "sender": dict(clock.seconds), "receiver": results.get(timeout=600)})
            med = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
            row = {"arm": arm, "gb_s": total / med["seconds"] / 1e9, "seconds": med["seconds"],
                   "groups": stats.groups, "runs_s": [r["seconds"] for r in runs],
                   "sender_ms": {k: 1e3 * v for k, v in med["sender"].items()},
                   "receiver_ms": {k: 1e3 * v for k, v in med["receiver"]["phases"].items()},
                   "receiver_s": med["receiver"]["seconds"]}
            rows.append(row)
            print(f"{arm:18s} {row['gb_s']:8.2f} GB/s  {med['seconds']:8.4f} s  {stats.groups:6d} groups  "
                  f"runs {[round(r['seconds'], 4) for r in runs]}", flush=True)
            print("    sender ms: " + " ".join(f"{k} {v:.1f}" for k, v in row["sender_ms"].items())
                  + " | receiver ms: " + " ".join(f"{k} {v:.1f}" for k, v in row["receiver_ms"].items()), flush=True)
        jobs.put("digest")
        digest = results.get(timeout=600)
        jobs.put(None)
        child.join(60)
    want = {n: float(t.double().sum()) for n, t in weights.items()}
    bad = [n for n in want if digest[n] != want[n]]
    report["receiver_holds_sender_bytes"] = not bad
    print("receiver holds the sender's weights: " + ("yes" if not bad else f"NO ({len(bad)} differ, e.g. {bad[:3]})"))
    by_arm = {r["arm"]: r["gb_s"] for r in rows}
    if "host:cuda:512M" in by_arm:
        for row in rows:
            row["x_host_512M"] = row["gb_s"] / by_arm["host:cuda:512M"]
            print(f"{row['arm']:18s} {row['x_host_512M']:9.1f}x host:cuda:512M")
    report["arms"] = rows
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
