"""Internal engine processes and the actor-side RPC client (vLLM ``collective_rpc``).

``EngineProcesses.start`` starts one process per TP rank, forked by this
process's multiprocessing fork server (``forkserver`` context) with torch,
``torch.distributed``, ``torch._inductor.config`` and the engine's harness modules
preloaded (:data:`PRELOAD`):
the fork server (a fresh interpreter, no threads, started on the first engine
of this process and kept for its life) imports them once, so an engine of TP n
pays one torch import instead of n, and a warm rollout actor's later workloads
none. Each process starts as a ``spawn`` one would:
``multiprocessing`` hands it this process's ``sys.path``, working directory and
main module, and ``engine_process_main`` replaces its environment with this
process's current one plus the engine's ``env`` (the fork server's own is the
one of the workload that started it). Each joins a private gloo world of the engine's TP ranks (TCP rendezvous on
127.0.0.1) and creates its TP group with ``group_desc="rollout_tp"``, then
builds an ``EngineWorker``. The actor talks to each process over a duplex
pipe: ``call(method, ...)`` sends the same call to every rank and returns
every rank's result in rank order; ``call_each`` sends per-rank kwargs. A
lock makes each fan-out atomic, so concurrent callers (async generation and a
refit) never interleave on the pipes.

No orphans: children exit on an ``__exit__`` message, on EOF of their pipe
(the actor died) and, on Linux, on the parent's death (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

READY_TIMEOUT_S = 300.0
# Imported once, in the fork server. ``torch._inductor.config`` is what
# ``torch.use_deterministic_algorithms`` imports (it pulls in dynamo: about 0.8 s of CPU), and
# every engine process calls it (``configure_determinism``) before it builds its engine. Then
# the harness modules every engine process imports on its way to its first refit (the engine,
# its tokenizer, its profiler, the refit receiver and pyzmq): the zygote preloads the same
# modules (``harness.runner.zygote.PRELOAD``), none reads the environment at import.
PRELOAD = ("torch", "torch.distributed", "torch._inductor.config", "harness.rollout.engine_worker",
           "harness.envs.tokenizer", "harness.profiler.trace", "harness.refit.zmq_stream", "zmq")
EXIT_TIMEOUT_S = 20.0


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _context() -> Any:
    """The fork-server context; the preload list is read when this process's server starts."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def start_fork_server() -> None:
    """Start this process's fork server now (it imports :data:`PRELOAD`), not on the first
    engine: a warm rollout actor started ahead of any workload does this while nothing else
    runs (``WarmRuntime.prestart``). The server is the one ``EngineProcesses.start`` uses."""
    from multiprocessing import forkserver

    _context()
    forkserver.ensure_running()


def engine_process_main(
    conn: Any, spec: dict, tp_rank: int, tp_size: int, port: int, profiler_rank: int, env: dict
) -> None:
    """Entry point of one internal engine process (picklable, module level). ``env``: the
    whole environment the process runs with (the starter's, plus the engine's variables)."""
    _die_with_parent()
    os.environ.clear()
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    from harness.runner.process_state import freeze_heap

    freeze_heap(collect=False)  # the fork server's preloads are never scanned again here
    torch.set_num_threads(1)
    worker = None
    try:
        try:
            group = None
            if tp_size > 1:
                from harness.parallel.rendezvous import DEFAULT_HOST, join_rendezvous

                dist.init_process_group(
                    "gloo", store=join_rendezvous(DEFAULT_HOST, port, READY_TIMEOUT_S), rank=tp_rank, world_size=tp_size
                )
                group = dist.new_group(list(range(tp_size)), group_desc="rollout_tp")
            from harness.rollout.engine_worker import EngineWorker

            worker = EngineWorker(spec, tp_rank=tp_rank, tp_size=tp_size, tp_group=group, profiler_rank=profiler_rank)
            conn.send(("ok", os.getpid()))
        except BaseException:  # noqa: BLE001 - reported to the parent process
            conn.send(("err", traceback.format_exc()))
            return
        while True:
            try:
                method, args, kwargs = conn.recv()
            except (EOFError, OSError):
                break  # the actor is gone
            if method == "__exit__":
                conn.send(("ok", None))
                break
            try:
                conn.send(("ok", getattr(worker, method)(*args, **kwargs)))
            except BaseException:  # noqa: BLE001 - reported to the parent process
                conn.send(("err", traceback.format_exc()))
    finally:
        if worker is not None:
            try:
                worker.close_side_groups()
            except Exception:  # noqa: BLE001 - best-effort cleanup
                pass
        if dist.is_initialized():
            dist.destroy_process_group()


class EngineProcesses:
    """The actor-side handle on an engine's internal processes."""

    def __init__(self, label: str, processes: list, conns: list, store: Any = None) -> None:
        self.label = label
        self._store = store  # the held rendezvous store, served for the processes' lifetime
        self.processes = processes
        self.conns = conns
        self._lock = threading.Lock()
        self.pids = [p.pid for p in processes]

    @classmethod
    def start(
        cls, spec: Mapping[str, Any], *, tp_size: int, rank_prefix: int, label: str, env: Mapping[str, str]
    ) -> EngineProcesses:
        """Spawn ``tp_size`` processes and wait until every engine is built and warmed up."""
        from harness.parallel.rendezvous import RendezvousServer

        ctx = _context()
        environ = {**os.environ, **{k: str(v) for k, v in env.items()}}
        store = RendezvousServer() if tp_size > 1 else None
        port = store.port if store is not None else 0
        processes, conns = [], []
        for rank in range(tp_size):
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=engine_process_main,
                args=(child, spec, rank, tp_size, port, rank_prefix + rank, environ),
                name=f"{label}-tp{rank}",
                daemon=True,
            )
            proc.start()
            child.close()
            processes.append(proc)
            conns.append(parent)
        self = cls(label, processes, conns, store)
        try:
            self.pids = self._collect("__init__", timeout_s=READY_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    def _collect(self, method: str, timeout_s: float | None = None) -> list[Any]:
        results, errors = [], []
        for rank, conn in enumerate(self.conns):
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while not conn.poll(1.0):
                if not self.processes[rank].is_alive():
                    raise RuntimeError(
                        f"{self.label} internal rank {rank} (pid {self.processes[rank].pid}) died during {method} "
                        f"(exit code {self.processes[rank].exitcode})"
                    )
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{self.label} internal rank {rank} did not answer {method} within {timeout_s}s")
            try:
                status, value = conn.recv()
            except EOFError:
                raise RuntimeError(f"{self.label} internal rank {rank} closed its pipe during {method}") from None
            if status == "ok":
                results.append(value)
            else:
                results.append(None)
                errors.append(f"{self.label} internal rank {rank} failed in {method}:\n{value}")
        if errors:
            raise RuntimeError("\n".join(errors))
        return results

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method`` on every rank; every rank's result, in rank order."""
        with self._lock:
            for conn in self.conns:
                conn.send((method, args, kwargs))
            return self._collect(method)

    def call_each(self, method: str, per_rank_kwargs: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Run ``method`` on every rank with that rank's kwargs."""
        if len(per_rank_kwargs) != len(self.conns):
            raise ValueError(f"{method}: {len(per_rank_kwargs)} kwarg sets for {len(self.conns)} ranks")
        with self._lock:
            for conn, kwargs in zip(self.conns, per_rank_kwargs):
                conn.send((method, (), dict(kwargs)))
            return self._collect(method)

    def stop(self) -> None:
        """Ask every process to exit, then terminate / kill stragglers; idempotent."""
        with self._lock:
            for conn in self.conns:
                try:
                    conn.send(("__exit__", (), {}))
                except (OSError, BrokenPipeError):
                    pass
            deadline = time.monotonic() + EXIT_TIMEOUT_S
            for proc in self.processes:
                proc.join(max(0.0, deadline - time.monotonic()))
            for proc in self.processes:
                if proc.is_alive():
                    proc.terminate()
                    proc.join(5.0)
                if proc.is_alive():
                    proc.kill()
                    proc.join(5.0)
            for conn in self.conns:
                conn.close()
            self.conns = []
            self.processes = []
            if self._store is not None:
                self._store.close()
                self._store = None
