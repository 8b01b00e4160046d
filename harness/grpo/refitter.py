"""Refit: the policy's full HF-named weights into every rollout engine.

Transport (``rollout.refit.transport``): ``zmq`` for colocated engines (policy
rank 0 binds one REQ socket per engine TP rank, each engine rank connects a
REP socket; two ping-pong buffers, COMPLETE/ACK; on ``platform.device: cuda``
the buffers are GPU memory sent as CUDA IPC handles; an engine planned on another node
than policy rank 0 gets ``tcp://`` endpoints that rank 0 binds on its node's address,
and the bytes travel in the messages, ``harness.refit.tcp_stream``), ``broadcast`` for separate
engines (a side process group of policy rank 0 + every engine rank that never
touches the default world); ``auto`` picks by placement. After a refit every
engine reports the same new weight version, or the step fails.

Broadcast side group, one per session: the first broadcast refit starts a
``RendezvousServer`` in this (driver) process -- bound before its port is handed out,
so no other process can take the port in between -- with a store prefix unique
to this ``Refitter``. Policy rank 0 and every engine rank join it as clients
and keep the group they build (``SideGroupSlot``); every later refit sends the
same signature, so every member reuses its group. Members close their group
on their own shutdown; ``close()`` (after the policy and the engines are shut
down) stops serving the store, last.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import ray

from harness.registry.refit import refit_transport, resolve
from harness.spec.topology import Topology, plan
from harness.spec.typed import RolloutSpec, as_workload

STAGING_ENV = "HARNESS_REFIT_STAGING"
ENDPOINTS_FILE = "refit_endpoints.json"


def choose_transport(rollout: RolloutSpec) -> str:
    """``rollout.refit.transport``; ``auto``: zmq when colocated, else broadcast
    (``harness.registry.refit.resolve``)."""
    return resolve(rollout.refit.transport, rollout.colocated)


class Refitter:
    def __init__(self, spec: Mapping[str, Any], policy, workers: list, run_dir: Path | None, *,
                 topology: Topology | None = None) -> None:
        """``workers``: the rollout workers of ``topology``'s engines, in engine order
        (``topology`` defaults to ``plan(spec)``); engine ``i``'s first rollout rank
        (its offset in the refit side group, after the policy's rank 0) is the topology's
        ``engines[i].rank_prefix``."""
        spec = as_workload(spec)
        self.spec = spec
        self.policy = policy
        self.workers = workers
        rollout = spec.rollout
        self.transport = choose_transport(rollout)  # chosen once; its name travels with every call
        self._transport = refit_transport(self.transport)
        self.buffer_size = rollout.refit.buffer_size_bytes
        # zmq on cuda: stage in GPU memory and send CUDA IPC handles (colocated on the GPUs)
        # ($HARNESS_REFIT_STAGING=host keeps host staging there: the before/after measurement)
        on_cuda = spec.platform.device == "cuda" and os.environ.get(STAGING_ENV) != "host"
        self.zmq_extra = {"staging_device": "cuda"} if on_cuda else {}
        if workers:
            engines = (topology if topology is not None else plan(spec)).engines
            if len(engines) != len(workers):
                raise ValueError(f"{len(workers)} rollout workers for a topology of {len(engines)} engines")
            self.prefixes = [engine.rank_prefix for engine in engines]
            from harness.runner.capacity import cross_node_engines

            self.cross_node = set(cross_node_engines((topology if topology is not None else plan(spec)).to_dict()))
            self._side_world = 1 + sum(len(engine.ranks) for engine in engines)  # policy rank 0 + every engine rank
        else:
            self.prefixes = []
            self.cross_node = set()
            self._side_world = 1
        self.history: list[dict] = []
        self._store = None  # RendezvousServer of the broadcast side group (first broadcast refit .. close)
        self._side: dict | None = None  # the side group's signature, the same for every refit
        self._closed = False
        self.store_host: str | None = None  # the side group's store address (None: loopback, one node)
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.endpoints: list[dict] | None = None  # the first zmq refit's endpoints per engine
        self._pending_endpoints: list[dict] = []

    def refit(self, step: int) -> dict:
        """One refit after ``step`` (0 = initial sync). Returns {version, seconds, transport,
        phases}; ``phases`` (zmq): seconds summed over the engines' streams -- ``collect`` (the
        policy's full weights on rank 0), ``send`` (the stream) and ``wait`` (the driver's round
        trips and the engines' last loads)."""
        t = time.perf_counter()
        phases: dict[str, float] = {}
        versions = self._transport.refit(self, phases)  # harness.refit.transport
        if len(set(versions)) != 1:
            raise RuntimeError(f"refit after step {step}: engines disagree on the weight version: {versions}")
        seconds = time.perf_counter() - t
        if phases:
            phases["wait"] = max(0.0, seconds - sum(phases.values()))
        record = {"step": step, "version": versions[0], "seconds": seconds,
                  "transport": self.transport, "phases": phases}
        self.history.append(record)
        return record

    def zmq_refit_engine(self, index: int, worker, phases: dict[str, float]) -> int:
        """The zmq transport's refit of engine ``index`` (``ZmqTransport.refit``): its new weight version."""
        addresses = ray.get(worker.refit_addresses.remote())
        extra = self.zmq_extra
        sender = None
        if index in self.cross_node:  # another node: tcp:// bound by rank 0 before the engine connects
            from harness.refit import tcp_stream
            from harness.refit.zmq_stream import DEFAULT_TIMEOUT_MS

            sender = self.policy.workers[0]
            addresses = ray.get(sender.__ray_call__.remote(tcp_stream.bind_in_actor, len(addresses),
                                                           DEFAULT_TIMEOUT_MS))
            extra = {}  # the bytes travel in the messages: no shared (host or CUDA IPC) staging
        if self.endpoints is None:
            self._pending_endpoints.append({"engine": index, "addresses": list(addresses)})
        receiving = worker.receive_weights.remote("zmq", addresses=addresses)
        try:
            for stats in self._stream_zmq(addresses, {"buffer_size_bytes": self.buffer_size, **extra}):
                for key, value in (getattr(stats, "seconds", None) or {}).items():
                    phases[key] = phases.get(key, 0.0) + float(value)
        except BaseException:
            ray.cancel(receiving, force=False)
            if sender is not None:  # sockets bound for a stream that did not run
                from harness.refit import tcp_stream

                try:
                    ray.get(sender.__ray_call__.remote(tcp_stream.close_in_actor), timeout=30)
                except Exception:  # noqa: BLE001 - the stream's own error is the one to report
                    pass
            raise
        return ray.get(receiving)

    def _stream_zmq(self, addresses: list[str], kw: dict[str, Any]) -> list[Any]:
        """Policy rank 0's send statistics of one stream to each of ``addresses`` (an engine's
        TP ranks), in order. A ``PolicyGroup`` gathers the full weights once for all of them
        (:func:`stream_to_each`, in every rank); another policy object (a test's wrapper)
        streams each address through its own ``stream_weights``."""
        gather = getattr(self.policy, "_gather", None)
        ranks = getattr(self.policy, "workers", None)
        if gather is None or not ranks or len(addresses) < 2:
            return [self.policy.stream_weights("zmq", address=address, **kw) for address in addresses]
        results = gather([w.__ray_call__.remote(stream_to_each, list(addresses), kw) for w in ranks], "stream_weights")
        return list(results[0])

    def record_endpoints(self) -> None:
        """After the first zmq refit: ``RUN_DIR/refit_endpoints.json`` lists each engine's
        endpoints (``ipc://`` on policy rank 0's node, ``tcp://HOST:PORT`` on another; an
        artifact, like ``placement.json``, never a surface)."""
        if self.endpoints is not None:
            return
        self.endpoints, self._pending_endpoints = self._pending_endpoints, []
        if self.run_dir is None:
            return
        doc = {"version": 1, "engines": [{**e, "scheme": e["addresses"][0].split("://")[0] if e["addresses"] else None,
                                          "cross_node": e["engine"] in self.cross_node} for e in self.endpoints]}
        path = self.run_dir / ENDPOINTS_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)

    def side_group(self) -> dict:
        """The session's side-group signature (host, port, world_size, prefix); starts
        serving its store on first use. Every broadcast refit hands out exactly this."""
        if self._closed:
            raise RuntimeError("the refitter is closed: its side-group store is no longer served")
        if self._side is None:
            from harness.parallel.rendezvous import RendezvousServer

            # bound here, before the port leaves this process
            self._store = RendezvousServer() if self.store_host is None else RendezvousServer(self.store_host)
            self._side = {"host": self._store.host, "port": int(self._store.port),
                          "world_size": self._side_world,
                          "prefix": f"harness-refit/{uuid.uuid4().hex}"}
        return dict(self._side)

    def broadcast_refit(self) -> list[int]:
        """The broadcast transport's refit of every engine (``BroadcastTransport.refit``): their weight versions."""
        side = self.side_group()
        receiving = [
            w.receive_weights.remote("broadcast", **side, rank_offset=1 + prefix,
                                     buffer_size_bytes=self.buffer_size, src=0)
            for w, prefix in zip(self.workers, self.prefixes)
        ]
        self.policy.stream_weights("broadcast", side_group={**side, "rank": 0}, buffer_size_bytes=self.buffer_size)
        return ray.get(receiving)

    def close(self) -> None:
        """Stop serving the side group's store (idempotent). Call it last, after the
        policy and the engines (the members) have closed their groups."""
        self._closed = True
        store, self._store = self._store, None
        if store is not None:
            store.close()


@contextlib.contextmanager
def gathered_once(engine: Any) -> Iterator[None]:
    """While open, ``engine.hf_state_dict`` gathers the full weights once per argument set and
    hands the same dict to every later call: one collective gather for several streams of the
    same weights (the model does not change within a refit). Every rank of the world must open
    it around the same calls (each call is a collective the first time only)."""
    full = engine.hf_state_dict
    memo: dict[tuple, Any] = {}

    def once(**kwargs: Any) -> Any:
        key = tuple(sorted(kwargs.items()))
        if key not in memo:
            memo[key] = full(**kwargs)
        return memo[key]

    engine.hf_state_dict = once
    try:
        yield
    finally:
        del engine.hf_state_dict  # the class's method again
        memo.clear()


def stream_to_each(worker: Any, addresses: list[str], kw: dict[str, Any]) -> list[Any]:
    """Runs in every policy rank (``__ray_call__``): ``worker.stream_weights("zmq", address=a,
    **kw)`` for each address in order, the full weights gathered once for all of them
    (:func:`gathered_once`). The streams are the ones per-address calls send, byte for byte:
    nothing trains in between. Returns each call's result (rank 0's send statistics; ``None``
    on the other ranks)."""
    with gathered_once(worker.engine):
        return [worker.stream_weights("zmq", address=address, **kw) for address in addresses]
