"""`PolicyWorker`: one policy rank as a Ray actor (`num_cpus=0`).

On construction: 1 torch thread, deterministic algorithms, the default
process group (gloo on CPU, nccl on cuda) over the policy world, seeds from
(spec seed, rank), the rank's policy engine (`harness.registry.policy.create_engine`), and the policy profiler from
`load_policy_profiler(rank=rank)` (env `NRL_POLICY_PROFILER_CLASS`) behind
`PolicyProfilerHooks`:
- `train` is profiled as one step (skipped in eval mode), aborts with
  `policy_train_error`;
- the split API goes through the hooks' begin/microbatch/finish/abort
  wrappers (reasons `policy_train_begin_error`, `..._microbatch_error`,
  `..._finish_error`, `policy_train_step_aborted`);
- `shutdown` closes the profiler, then the refit side group and the
  data-plane clients (one per data-plane actor, reused across calls), then
  destroys the process group.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

_IMPORT_STARTED = time.time()  # start-up timings (``ready()["timings"]``): the heavy imports begin

import ray  # noqa: E402 - after the import stamp
import torch  # noqa: E402 - after the import stamp

from harness.policy.distributed import init_distributed  # noqa: E402 - after the import stamp
from harness.registry.policy import create_engine  # noqa: E402 - after the import stamp
from harness.registry.refit import refit_transport  # noqa: E402 - after the import stamp
from harness.runner.process_state import WarmHost  # noqa: E402 - after the import stamp
from harness.spec.typed import as_workload  # noqa: E402 - after the import stamp

_IMPORTED = time.time()


class PolicyWorkerImpl:
    records_numerics = True  # the numerics surface (docs/locator.md); a teacher rank records none
    def __init__(
        self,
        spec: Mapping[str, Any],
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        run_dir: str,
        topology: Any = None,
    ) -> None:
        self.rank = rank
        self.run_dir = run_dir
        self.spec = spec = as_workload(spec)
        t0 = time.time()
        init_distributed(rank, world_size, master_addr, master_port, spec.platform.device)
        t1 = time.time()
        self.engine = create_engine(spec, rank, topology=topology)
        t2 = time.time()
        self.hooks = _load_hooks(rank)
        from harness.policy.numerics_probe import NumericsRecorder

        self.numerics = NumericsRecorder(spec, self.engine, rank, run_dir, enabled=self.records_numerics)
        self.timings = _start_timings(init_started=t0, process_groups=t1, engine=t2, profiler=time.time())
        from harness.refit.broadcast import SideGroupSlot

        self._side_group = SideGroupSlot()  # rank 0's refit side group, built by the first broadcast
        self._dataplane_clients: dict[Any, Any] = {}  # actor handle -> DataPlaneClient, closed on shutdown

    def ready(self) -> dict[str, Any]:
        """Rank, coordinates, pid, ``python`` (the interpreter this rank runs) and ``timings``:
        wall-clock stamps of this rank's start-up (``process``, ``import_started``, ``imported``,
        ``init_started``, ``process_groups``, ``engine``, ``profiler``) for the phase bench;
        a reused process keeps its first three."""
        return {"rank": self.rank, "coords": dict(self.engine.coords), "pid": os.getpid(),
                "python": sys.executable, "timings": dict(self.timings)}

    # -- training -------------------------------------------------------------------

    def train(self, batch: Mapping[str, torch.Tensor], eval_mode: bool = False) -> dict[str, float]:
        with self.hooks.train_step(eval_mode=eval_mode):
            if eval_mode:
                return self.engine.train(batch, eval_mode=eval_mode)
            self.numerics.begin()
            try:
                out = self.engine.train(batch, eval_mode=eval_mode)
            except BaseException:
                self.numerics.abort()
                raise
            self.numerics.finish()
            return out

    def begin_train_step(self) -> None:
        out = self.hooks.begin_step(self.engine.begin_train_step, worker_step_open=self.engine.step_open)
        self.numerics.begin()
        return out

    def train_microbatch(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        return self.hooks.train_microbatch(self.engine.train_microbatch, batch)

    def finish_train_step(self) -> dict[str, float]:
        out = self.hooks.finish_step(self.engine.finish_train_step)
        self.numerics.finish()
        return out

    def abort_train_step(self) -> None:
        self.numerics.abort()
        return self.hooks.abort_step(self.engine.abort_train_step)

    # -- data-plane variants (the "dataplane" trainer passes keys, not tensors) -----------

    def _dataplane(self, dataplane: Any) -> Any:
        """This worker's one client of the data-plane actor ``dataplane`` (a handle or a
        client), reused across calls and closed by :meth:`shutdown`."""
        from harness.dataplane.actor import DataPlaneClient

        handle = dataplane.handle if isinstance(dataplane, DataPlaneClient) else dataplane
        client = self._dataplane_clients.get(handle)
        if client is None:
            client = self._dataplane_clients[handle] = DataPlaneClient(handle)
        return client

    def dataplane_clients(self) -> int:
        """How many data-plane clients this worker holds open (diagnostics, tests)."""
        return len(self._dataplane_clients)

    def _close_dataplane_clients(self) -> None:
        clients, self._dataplane_clients = list(self._dataplane_clients.values()), {}
        for client in clients:
            client.close()

    def _dp_shard(self, dataplane: Any, key: str, extra_keys: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
        """This rank's DP shard of the batch staged under ``key``, plus per-shard extras
        staged by :meth:`logprobs_to_dataplane` under ``<extra>/dp<d>``."""
        from harness.parallel.data import shard_for_dp

        client = self._dataplane(dataplane)
        dp, d = self.spec.policy.dp, int(self.engine.coords["dp"])
        shard = shard_for_dp(client.get_tensors(key), dp, d)
        for extra in extra_keys:
            shard.update(client.get_tensors(f"{extra}/dp{d}"))
        return shard

    def logprobs_to_dataplane(self, dataplane: Any, key: str, out_key: str, field: str, reference: bool) -> None:
        """Compute (reference) logprobs of this rank's shard; output ranks stage
        them under ``<out_key>/dp<d>`` as ``{field: Tensor}``."""
        shard = self._dp_shard(dataplane, key)
        out = self.engine.get_reference_logprobs(shard) if reference else self.engine.get_logprobs(shard)
        c = self.engine.coords
        if c["tp"] == 0 and c["cp"] == 0 and c["pp"] == self.spec.policy.pp - 1:
            self._dataplane(dataplane).put_tensors(f"{out_key}/dp{c['dp']}", {field: out})

    def train_from_dataplane(self, dataplane: Any, key: str, extra_keys: list[str]) -> dict[str, float]:
        return self.train(self._dp_shard(dataplane, key, tuple(extra_keys)))

    # -- inference / weights --------------------------------------------------------------

    def get_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.engine.get_logprobs(batch)

    def get_reference_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.engine.get_reference_logprobs(batch)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return self.engine.hf_state_dict()

    def parameter_checksums(self) -> dict[str, list[float]]:
        """{HF name: [sum, sum of squares]} in float64, on rank 0 ({} elsewhere)."""
        sd = self.engine.hf_state_dict()
        return {
            k: [float(v.double().sum()), float(v.double().pow(2).sum()), float(v.double().abs().sum())]
            for k, v in sd.items()
        }

    def stream_weights(self, transport: str, **kw: Any) -> Any:
        """Gather full weights (collective) and send them from policy rank 0 through the
        refit transport ``transport`` (``harness.registry.refit``; its ``send`` says which
        keywords it takes: ``harness.refit.transport``). A broadcast's ``kw["side_group"]``
        is a ``SideGroup`` or, for a mapping of ``create_side_group`` arguments, rank 0's
        session group: joined (as a client of the driver's store) by the first broadcast
        and reused while the signature is unchanged; `shutdown` closes it.

        With CUDA IPC staging (zmq, a cuda ``staging_device``) and an engine that
        can (``DEVICE_STATE_DICT``), the weights stay on the GPU from the
        parameters into the staging buffers: no host copy, no pickled tensors
        (`PolicyEngine.hf_state_dict(on_device=True)`). The zmq result's
        ``seconds`` holds ``collect`` (the full weights on rank 0) and ``send``."""
        sender = refit_transport(transport)  # an unknown name is refused on every rank, before the gather
        t0 = time.perf_counter()
        on_device = sender.on_device(kw) and getattr(self.engine, "DEVICE_STATE_DICT", False)
        named = self.engine.hf_state_dict(on_device=True) if on_device else self.engine.hf_state_dict()
        if self.rank != 0:
            return None
        items = list(named.items())
        return sender.send(self, items, kw, time.perf_counter() - t0)

    def save_checkpoint(self, directory: str) -> None:
        self.engine.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        self.engine.load_checkpoint(directory)

    def side_groups(self) -> list[dict]:
        """The refit side group this rank holds: ``[]`` or one signature dict (rank 0 only)."""
        return self._side_group.describe()

    def shutdown(self) -> None:
        """Close the profiler, then the refit side group, the data-plane clients and the
        default process group (each step runs even if an earlier one failed)."""
        import torch.distributed as dist

        def cleanup() -> None:
            try:
                self._side_group.close()
            finally:
                try:
                    self._close_dataplane_clients()
                finally:
                    if dist.is_initialized():
                        dist.destroy_process_group()

        self.numerics.close()
        self.hooks.close(cleanup)


def _start_timings(**stamps: float) -> dict[str, float | None]:
    from harness.runner.process_state import process_start_time

    return {"process": process_start_time(), "import_started": _IMPORT_STARTED, "imported": _IMPORTED, **stamps}


class PolicyWorkerHost(WarmHost, PolicyWorkerImpl):
    """A warm policy process (``harness.runner.warm``): started once with torch imported, then
    adopted by one workload after another. Each ``adopt`` restores the fresh-process state
    (``ProcessBaseline``), applies the workload's environment and builds the rank exactly as
    ``PolicyWorkerImpl.__init__`` does (new process groups, model, optimizer, seeds, profiler);
    ``retire`` shuts the rank down and drops every reference to it."""

    warm_role = "policy"

    def adopt(self, env_vars: Mapping[str, str], *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self._adopted:
            raise RuntimeError(f"warm policy process {os.getpid()} is still adopted by a workload")
        self._baseline.restore(dict(env_vars))
        self._adopted = True
        PolicyWorkerImpl.__init__(self, *args, **kwargs)
        return self.ready()

    def retire(self) -> int:
        """Shut the rank down (profiler, side group, data-plane clients, process group) and
        forget it; returns this pid. Raises if the shutdown failed (the pool then kills it)."""
        import torch.distributed as dist

        try:
            if hasattr(self, "hooks"):
                self.shutdown()
            if dist.is_initialized():  # an adopt that failed half-way: not reusable
                dist.destroy_process_group()
                raise RuntimeError(f"warm policy process {os.getpid()}: process group left from a failed start")
        finally:
            numerics = self.__dict__.get("numerics")
            if numerics is not None:
                numerics.close()
            for name in ("engine", "hooks", "_side_group", "_dataplane_clients", "timings", "numerics"):
                self.__dict__.pop(name, None)
            self._adopted = False
            gc.collect()
            self._baseline.restore()
        return os.getpid()


def _load_hooks(rank: int):
    from harness.plugins.loader import load_policy_profiler
    from harness.plugins.policy_hooks import PolicyProfilerHooks

    return PolicyProfilerHooks(load_policy_profiler(rank=rank))


PolicyWorker = ray.remote(num_cpus=0)(PolicyWorkerImpl)
PolicyHost = ray.remote(num_cpus=0)(PolicyWorkerHost)
