"""``RolloutWorker``: the Ray actor that owns one rollout engine.

Placement (docs/rollout.md, "RolloutWorker"; the processes mirror vLLM's workers):

* sync engine with ``rollout.tp == 1``: the engine (an ``EngineWorker``) and
  its rollout profiler live in this actor; profiler rank = ``RANK`` from the
  environment (set to ``rank_prefix`` when absent);
* ``rollout.tp > 1`` or ``rollout.async``: one internal engine process per TP
  rank (``engine_procs.py``), each with its own profiler of rank
  ``rank_prefix + internal_rank``; this actor fans calls out like vLLM's
  ``collective_rpc`` and returns internal rank 0's result.

Start-up order: environment, topology gate and ``rollout.worker_cls`` check
(before any engine exists), then engine creation inside the profiler's
engine-init window, warm-up, and ``end_engine_initialization``.

The class is an *async* Ray actor: ``generate_one`` calls may be many in
flight; they are queued and dispatched to the engine in batches (whatever is
pending when the engine frees up), and since the engine is batch-invariant a
request's result is the same however it was batched. Every other method runs
to completion on the event loop (fan-outs to internal processes run in a
thread, serialised by the RPC lock).

Shutdown closes profilers first, then the refit side groups on every rank,
then stops the internal processes (no orphans), then the capture sink.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from harness.plugins.rollout_hooks import (
    outer_rollout_rank,
    rollout_profiler_class_path,
    validate_engine_worker_cls,
    validate_rollout_profiler_topology,
)
from harness.refit.zmq_stream import ipc_address
from harness.registry.rollout import start_function
from harness.rollout.refit_calls import per_rank_refit_calls
from harness.rollout.sharding import ShardPlan
from harness.runner.process_state import WarmHost
from harness.spec.typed import Workload

CAPTURE_ABORT_REASON = "generation_error"
_IMPORTED = time.time()  # start-up timings (``ready()["timings"]``)


class RolloutWorker:
    """One rollout engine (see module docstring). Wrap with ``ray.remote(num_cpus=0)``."""

    def __init__(
        self,
        spec: Workload,
        engine_index: int,
        rank_prefix: int,
        run_dir: str,
        env_vars: Mapping[str, str] | None = None,
        capture_config: Mapping[str, Any] | None = None,
    ) -> None:
        """``spec``: the plan's typed workload (``RunPlan.workload``, received as a value: not
        converted or checked again). ``capture_config``: the ``CaptureSink.from_config`` dict (the runner's
        data-plane actor and ledger); default: derived from the spec and run dir."""
        init_started = time.time()
        self._capture_config = dict(capture_config) if capture_config else None
        if env_vars:
            os.environ.update({k: str(v) for k, v in env_vars.items()})
        self.spec = spec
        self.engine_index = int(engine_index)
        self.rank_prefix = int(rank_prefix)
        self.run_dir = str(run_dir)
        rollout = self.spec.rollout
        self.tp = rollout.tp
        self.is_async = rollout.is_async
        self.label = f"rollout engine {self.engine_index}"
        # Gate before any engine starts.
        validate_engine_worker_cls(rollout.worker_cls)
        if rollout_profiler_class_path(env_vars):
            validate_rollout_profiler_topology(pp=rollout.pp, ep=rollout.ep)
        start_engine = start_function(rollout.backend)  # ValueError: no engine in this build
        from harness.rollout.engine_worker import configure_determinism

        configure_determinism(self.spec.platform.device)
        self._local = None
        self._procs = None
        self._pending: list[tuple[dict, asyncio.Future]] = []   # arrival order, coalesced
        self._waves: dict[str, dict[int, tuple[dict, asyncio.Future]]] = {}
        self._wave_batches: list[list[tuple[dict, asyncio.Future]]] = []
        self._dispatcher: asyncio.Task | None = None
        self._capture_sink = None
        self._closed = False
        in_actor = self.tp == 1 and not self.is_async
        if in_actor:
            os.environ.setdefault("RANK", str(self.rank_prefix))
        engine = start_engine(self.spec, in_actor=in_actor, profiler_rank=outer_rollout_rank() if in_actor else 0,
                              rank_prefix=self.rank_prefix, label=self.label, run_dir=self.run_dir,
                              engine_index=self.engine_index, env_vars=env_vars)
        if in_actor:
            self._local = engine
            self._local.end_engine_initialization()
        else:
            self._procs = engine
            self._procs.call("end_engine_initialization")
        from harness.runner.process_state import process_start_time

        self.timings = {"process": process_start_time(), "imported": _IMPORTED, "init_started": init_started,
                        "engine": time.time()}

    # -- fan-out -------------------------------------------------------------------
    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Rank 0's result of ``method`` (run on every TP rank)."""
        if self._closed:
            raise RuntimeError(f"{self.label} is shut down")
        if self._local is not None:
            return getattr(self._local, method)(*args, **kwargs)
        return self._procs.call(method, *args, **kwargs)[0]

    async def _call_async(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._local is not None:
            return self._call(method, *args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: self._call(method, *args, **kwargs))

    # -- info ------------------------------------------------------------------------
    def ready(self) -> dict[str, Any]:
        """Process ids: this actor and its internal engine processes (empty when in-actor), and
        ``timings``: wall-clock stamps of the start-up (``process``, ``imported``, ``init_started``,
        ``engine`` = engine processes built and warmed up) for the phase bench."""
        return {
            "timings": dict(self.timings),
            "actor_pid": os.getpid(),
            "python": sys.executable,
            "engine_pids": [] if self._procs is None else list(self._procs.pids),
            "engine_index": self.engine_index,
            "tp": self.tp,
            "async": self.is_async,
        }

    def weight_version(self) -> int:
        return self._call("weight_version")

    def set_weight_version(self, version: int) -> int:
        """Resume support: every TP rank continues from ``version``."""
        if self._local is not None:
            return self._local.set_weight_version(version)
        versions = self._procs.call("set_weight_version", version)
        return versions[0]

    def state_dict_info(self) -> dict:
        return self._call("state_dict_info")

    def refit_addresses(self) -> list[str]:
        """One ZMQ ``ipc://`` endpoint per TP rank; the colocated sender for rank r binds ``[r]``."""
        directory = os.path.join(self.run_dir, "ipc")
        os.makedirs(directory, exist_ok=True)
        return [ipc_address(directory, f"e{self.engine_index}-tp{r}") for r in range(self.tp)]

    def get_weights(self) -> dict:
        """Full HF-named tensors rebuilt from every TP rank's shards (tests, refit checks)."""
        from harness.model.config import ModelConfig

        if self._local is not None:
            return self._local.state_dict()
        shards = self._procs.call("state_dict")
        cfg = ModelConfig.from_spec(self.spec.model)
        plans = ShardPlan(cfg, 0, self.tp)
        return {name: plans.unshard(name, [s[name] for s in shards]) for name in shards[0]}

    # -- generation ----------------------------------------------------------------------
    def _sink(self):
        if self._capture_sink is None:
            from harness.capture.sink import CaptureSink, capture_config_from_spec  # engineer G

            cfg = self._capture_config or capture_config_from_spec(self.spec, self.run_dir)
            self._capture_sink = CaptureSink.from_config(cfg)
        return self._capture_sink

    async def _generate_batch(self, requests: list[dict]) -> list[dict]:
        """Generate with capture staging around every request that carries ``capture``.

        Capture is batched: one ``begin_requests`` before the engine call and
        one ``finish_requests`` (group commit) after it. If the batch cannot
        begin, no handle stays in flight (the sink writes failure rows for the
        batch's calls) and the error names the request at fault; if generation
        fails, every handle is aborted with a failure row."""
        captured = [i for i, r in enumerate(requests) if r.get("capture") is not None]
        handles: dict[int, Any] = {}
        if captured:
            from harness.capture.sink import CaptureBeginError

            version = await self._call_async("weight_version")
            items = [(requests[i]["capture"], list(requests[i]["prompt_ids"])) for i in captured]
            try:
                opened = self._sink().begin_requests(items, weight_version=version)
            except CaptureBeginError as exc:
                at = captured[exc.index] if exc.index is not None else None
                who = (f"request {requests[at].get('request_id')!r} (position {at} of the batch)" if at is not None
                       else f"a batch of {len(captured)} captured requests")
                raise CaptureBeginError(f"{self.label}: capture could not begin {who}: {exc}", at) from exc
            handles = dict(zip(captured, opened))
        try:
            results = await self._call_async("generate", [dict(r) for r in requests])
        except BaseException:
            if handles:
                self._sink().abort_requests(list(handles.values()), CAPTURE_ABORT_REASON)
            raise
        if handles:  # group commit: one stage + one ledger transaction for the whole batch
            finished = [(h, results[i]["output_ids"], results[i]["logprobs"], results[i]["weight_version"])
                        for i, h in handles.items()]
            for i, coords in zip(handles, self._sink().finish_requests(finished)):
                results[i]["capture"] = coords
        return results

    async def generate(self, requests: list[dict]) -> list[dict]:
        """Sync generation of a batch; results in request order."""
        return await self._generate_batch(list(requests))

    async def generate_one(self, request: dict) -> dict:
        """Async generation of one request; many may be in flight.

        Scheduling: requests are batched in arrival order, which depends on
        timing. A request may carry ``wave = {"id", "size", "index"}``: the
        requests of one wave are then held until all ``size`` have arrived and
        run as one batch in ``index`` order, so the engine's schedule (and the
        operators and collectives it issues) is the same on every rerun. Tokens
        never depend on scheduling either way (per-request seeds, batch-invariant
        engine); the waves make the profiled inventories deterministic too.
        """
        future = asyncio.get_running_loop().create_future()
        wave = request.get("wave")
        if wave is None:
            self._pending.append((request, future))
        else:
            request = {k: v for k, v in request.items() if k != "wave"}
            members = self._waves.setdefault(str(wave["id"]), {})
            members[int(wave["index"])] = (request, future)
            if len(members) == int(wave["size"]):
                del self._waves[str(wave["id"])]
                self._wave_batches.append([members[i] for i in sorted(members)])
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.ensure_future(self._dispatch())
        return await future

    async def _dispatch(self) -> None:
        while self._wave_batches or self._pending:
            if self._wave_batches:
                batch = self._wave_batches.pop(0)
            else:
                batch, self._pending = self._pending, []
            try:
                results = await self._generate_batch([request for request, _ in batch])
            except asyncio.CancelledError:
                # The dispatcher itself is being cancelled (actor shutdown): every
                # waiting request is cancelled with it, and the cancellation goes on.
                for _, future in batch + self._pending + [m for b in self._wave_batches for m in b]:
                    if not future.done():
                        future.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - every failure goes to the waiting requests
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)

    # -- profiler lifecycle --------------------------------------------------------------
    async def begin_rollout(self, step_id: int | str) -> None:
        await self._call_async("begin_rollout", step_id)

    async def finish_rollout(self) -> None:
        await self._call_async("finish_rollout")

    async def abort_rollout(self, reason: str) -> None:
        await self._call_async("abort_rollout", reason)

    # -- refit -----------------------------------------------------------------------
    async def receive_weights(self, transport: str, **kw: Any) -> int:
        """Receive one refit; returns the new weight version (all TP ranks agree).

        ``transport`` ``zmq`` or ``broadcast`` and its keywords are checked and fanned
        out per TP rank by ``harness.rollout.refit_calls``. For ``broadcast`` each
        rank builds its side group on the first refit and reuses it while the
        signature is unchanged (one group per rank per session).
        """
        if self._closed:
            raise RuntimeError(f"{self.label} is shut down")
        method, per_rank = per_rank_refit_calls(self.label, self.tp, transport, kw, self.refit_addresses)
        if self._local is not None:
            return getattr(self._local, method)(**per_rank[0])
        loop = asyncio.get_running_loop()
        versions = await loop.run_in_executor(None, self._procs.call_each, method, per_rank)
        if len(set(versions)) != 1:
            raise RuntimeError(f"{self.label}: TP ranks disagree on the weight version after refit: {versions}")
        return versions[0]

    def side_groups(self) -> list[list[dict]]:
        """Per TP rank, the refit side groups it holds (``[]`` or one signature dict).

        Also answers after ``shutdown`` for an in-actor engine (its groups are
        closed then); internal processes are gone after shutdown (``[]`` each)."""
        if self._local is not None:
            return [self._local.side_groups()]
        if self._procs is None or self._closed:
            return [[] for _ in range(self.tp)]
        return self._procs.call("side_groups")

    # -- shutdown ----------------------------------------------------------------------
    def shutdown(self) -> None:
        """Close profilers, then refit side groups, then the engine processes, then the
        capture sink; idempotent.

        A profiler close error is re-raised after every resource is released.
        """
        if self._closed:
            return
        self._closed = True
        error: BaseException | None = None
        try:
            try:
                if self._local is not None:
                    self._local.close_profiler()
                elif self._procs is not None:
                    self._procs.call("close_profiler")
            finally:  # refit side groups: closed even when the profiler close failed
                if self._local is not None:
                    self._local.close_side_groups()
                elif self._procs is not None:
                    self._procs.call("close_side_groups")
        except BaseException as exc:  # noqa: BLE001 - re-raised after cleanup
            error = exc
        finally:
            stop_engine = getattr(self._local, "shutdown_engine", None)  # the in-actor vLLM engine
            if stop_engine is not None:
                stop_engine()
            if self._procs is not None:
                self._procs.stop()
            sink, self._capture_sink = self._capture_sink, None
            close = getattr(sink, "close", None)
            if callable(close):
                close()
        if error is not None:
            raise error


class RolloutWorkerHost(WarmHost, RolloutWorker):
    """A warm rollout actor process (``harness.runner.warm``), adopted by one workload after
    another: ``adopt`` restores the fresh-process state (``ProcessBaseline``), applies the
    workload's environment and builds the engine exactly as ``RolloutWorker.__init__`` does
    (internal engine processes are new for every workload); ``retire`` shuts it down and
    drops every reference to it."""

    warm_role = "rollout"

    def adopt(self, env_vars: Mapping[str, str], *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self._adopted:
            raise RuntimeError(f"warm rollout process {os.getpid()} is still adopted by a workload")
        self._baseline.restore(dict(env_vars))
        self._adopted = True
        RolloutWorker.__init__(self, *args, env_vars=env_vars, **kwargs)
        return self.ready()

    def start_engine_server(self) -> None:
        """Start the fork server of internal engine processes now (``engine_procs.start_fork_server``),
        before a workload with an async or TP > 1 engine needs it."""
        from harness.rollout.engine_procs import start_fork_server

        start_fork_server()

    def retire(self) -> int:
        """Shut the engine down and forget it; returns this pid (raises if the shutdown failed)."""
        try:
            if hasattr(self, "_closed"):
                self.shutdown()
            if getattr(self, "_pending", None) or getattr(self, "_waves", None):
                raise RuntimeError(f"warm rollout process {os.getpid()}: requests still queued")
        finally:
            keep = {"_baseline"}
            for name in [n for n in self.__dict__ if n not in keep]:
                del self.__dict__[name]
            self._adopted = False
            gc.collect()
            self._baseline.restore()
        return os.getpid()


def rollout_worker_actor():
    """The Ray actor class (``num_cpus=0``), created lazily so importing this module needs no Ray."""
    import ray

    return ray.remote(num_cpus=0)(RolloutWorker)


def rollout_worker_host_actor():
    """The warm-pool actor class (``RolloutWorkerHost``, ``num_cpus=0``)."""
    import ray

    return ray.remote(num_cpus=0)(RolloutWorkerHost)
