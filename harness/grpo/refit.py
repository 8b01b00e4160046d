"""Refit: the policy's full HF-named weights into every rollout engine.

Transport (``rollout.refit.transport``): ``zmq`` for colocated engines (policy
rank 0 binds one REQ socket per engine TP rank, each engine rank connects a
REP socket; two ping-pong buffers, COMPLETE/ACK), ``broadcast`` for separate
engines (a side process group of policy rank 0 + every engine rank that never
touches the default world); ``auto`` picks by placement. After a refit every
engine reports the same new weight version, or the step fails.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def choose_transport(spec: dict) -> str:
    transport = spec["rollout"]["refit"]["transport"]
    if transport == "auto":
        return "zmq" if spec["rollout"]["colocated"] else "broadcast"
    return transport


class Refitter:
    def __init__(self, spec: dict, policy, workers: list, run_dir: Path) -> None:
        self.spec = spec
        self.policy = policy
        self.workers = workers
        self.transport = choose_transport(spec)
        self.buffer_size = int(spec["rollout"]["refit"]["buffer_size_bytes"])
        self.prefixes = [e * int(spec["rollout"]["tp"]) for e in range(len(workers))]
        self.history: list[dict] = []

    def refit(self, step: int) -> dict:
        """One refit after ``step`` (0 = initial sync). Returns {version, seconds, transport}."""
        t = time.perf_counter()
        if self.transport == "zmq":
            versions = [self._zmq(w) for w in self.workers]
        else:
            versions = self._broadcast()
        if len(set(versions)) != 1:
            raise RuntimeError(f"refit after step {step}: engines disagree on the weight version: {versions}")
        record = {"step": step, "version": versions[0], "seconds": time.perf_counter() - t,
                  "transport": self.transport}
        self.history.append(record)
        return record

    def _zmq(self, worker) -> int:
        addresses = ray.get(worker.refit_addresses.remote())
        receiving = worker.receive_weights.remote("zmq", addresses=addresses)
        try:
            for address in addresses:
                self.policy.stream_weights("zmq", address=address, buffer_size_bytes=self.buffer_size)
        except BaseException:
            ray.cancel(receiving, force=False)
            raise
        return ray.get(receiving)

    def _broadcast(self) -> list[int]:
        tp = int(self.spec["rollout"]["tp"])
        world = 1 + tp * len(self.workers)
        port = _free_port()
        receiving = [
            w.receive_weights.remote("broadcast", host="127.0.0.1", port=port, world_size=world,
                                     rank_offset=1 + prefix, buffer_size_bytes=self.buffer_size, src=0)
            for w, prefix in zip(self.workers, self.prefixes)
        ]
        self.policy.stream_weights(
            "broadcast",
            side_group={"host": "127.0.0.1", "port": port, "rank": 0, "world_size": world},
            buffer_size_bytes=self.buffer_size,
        )
        return ray.get(receiving)
