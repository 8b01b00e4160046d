"""`PolicyGroup`: starts the policy world as Ray actors and fans calls out.

- The group receives the run's plan as values (`harness.spec.runplan.RunPlan`: the typed
  `Workload` and its `Topology`); the layout was validated there, before any process
  started, so nothing here converts, plans or checks the spec again.
- A train/logprob batch is split into contiguous DP shards; TP/CP/PP peers of
  a DP rank receive the same shard.
- Outputs: metrics from the last pipeline stage's (tp=0, cp=0, dp=0) rank;
  logprobs from the last-stage (tp=0, cp=0) rank of each DP shard,
  concatenated in DP order (already in sequence order, CP-unchunked).
- A dead or failing worker raises `RuntimeError` naming the rank that failed
  first (`first_failure`) with its own error text (`own_error_text`: no Ray
  wrapper, traceback or colour codes), and its peers' errors as consequences.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from typing import Any

import ray
import torch

from harness.parallel.data import shard_for_dp
from harness.parallel.rendezvous import RendezvousServer
from harness.policy.worker import PolicyWorker
from harness.spec.typed import Workload
from harness.workerenv.select import actor_runtime_env

DEATH_GRACE_S = 10.0
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# What a rank sees when a peer went away first: consequences, never the cause.
PEER_SYMPTOMS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out", "timed out",
                 "Socket closed", "connection refused", "Connection refused")


def own_error_text(exc: BaseException, limit: int = 600) -> str:
    """A worker's own error without Ray's wrapper, traceback or colour codes: the exception it
    raised (``type: message``), or for a dead worker Ray's exit detail and the last exception
    line of its log when one can be found."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
        text = f"{type(cause).__name__}: {cause}"
    else:
        raw = _ANSI.sub("", str(exc))
        m = re.search(r"Worker exit type: (\S+) Worker exit detail: (.*?\.)(?: |$)", raw, re.DOTALL)
        text = f"worker process exited ({m.group(1)}: {m.group(2)})" if m else raw.strip().splitlines()[0]
        raised = _creation_error(raw)
        if raised:
            text += f"; it raised {raised}"
        logged = _logged_exception(raw)
        if logged:
            text += f"; its log: {logged}"
    text = " ".join(_ANSI.sub("", text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Mismatch|Interrupt)): (.+)$")


def _creation_error(message: str) -> str | None:
    """The exception line (``type: message``) an actor's constructor raised, from the traceback
    Ray puts in an ``ActorDiedError`` for a failed creation task (None: no such traceback)."""
    if "creation task" not in message:
        return None
    found = [line.strip() for line in message.splitlines() if _RAISED.match(line.strip())]
    return found[-1] if found else None


def _logged_exception(message: str) -> str | None:
    """The last ``SomethingError: ...`` line of the dead worker's stderr log (found by its pid)."""
    m = re.search(r"\bpid: (\d+)", message)
    if not m:
        return None
    try:
        from pathlib import Path

        logs = Path(ray._private.worker._global_node.get_logs_dir_path())
        files = sorted(logs.glob(f"worker-*-{m.group(1)}.err"))
        lines = files[-1].read_text(errors="replace").splitlines() if files else []
    except Exception:  # noqa: BLE001 - the log is a nicety; the exit detail stands without it
        return None
    found = [ln.strip() for ln in lines if re.match(r"^\s*[\w.]+(Error|Exception|Exit)\b.*", ln)]
    return _ANSI.sub("", found[-1]) if found else None


def first_failure(errors: Mapping[int, tuple[str, BaseException]], texts: Mapping[int, str]) -> int:
    """The rank that failed first: the first dead worker the driver saw, else the first whose
    error is not a peer's symptom (a closed connection, a timeout), else the first error seen."""
    order = list(errors)
    dead = [r for r in order if errors[r][0] == "died"]
    if dead:
        return dead[0]
    own = [r for r in order if not any(s in texts[r] for s in PEER_SYMPTOMS)]
    return own[0] if own else order[0]


class PolicyGroup:
    worker_actor = PolicyWorker  # the actor class of a rank (a distillation teacher's: harness.distill.teacher)
    role = "policy"  # how errors name the ranks

    def __init__(
        self,
        spec: Workload,
        topology: Any,
        run_dir: str,
        *,
        env_vars: Mapping[str, str] | None = None,
        address: str | None = None,
        pool: Any = None,
        placement: Any = None,
    ) -> None:
        """``spec``, ``topology``: the plan's typed workload and layout (``RunPlan.workload``,
        ``RunPlan.topology``; a ``ValueError`` before any actor starts when ``topology`` has no
        policy layout of the spec's world). ``pool``: a ``harness.runner.warm.WarmRuntime``
        whose warm policy processes the ranks adopt (Ray must be up); shutdown hands them back
        when every rank retired cleanly, else kills them. Without it every rank is a new actor (a cold start).
        ``placement``: a ``harness.runner.placement.Placement`` pinning each new rank to its
        planned bundle; when it spans nodes the rendezvous store is handed out on this
        process's node address (reachable from every node), else on loopback."""
        self.spec = spec
        self.run_dir = run_dir
        self.world = spec.policy.world_size
        self.dp = spec.policy.dp
        layout = getattr(topology, "policy", None)
        self.coords = [dict(r.coords) for r in layout.ranks] if layout is not None else None
        if self.coords is None or len(self.coords) != self.world:
            raise ValueError(f"topology has no policy layout of {self.world} ranks")
        self._started_ray = False
        self._pool = pool
        self._clean = True  # pooled: no call failed, so the processes may be reused
        if pool is None and not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            if address:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:
                from harness.runner.ray_start import local_start

                with local_start(log_to_driver=False):  # "local": RAY_ADDRESS is not followed (see runner/session.py)
                    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False,
                             log_to_driver=False)
            self._started_ray = True
        env = {"RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1", **(env_vars or {})}
        host = ray.util.get_node_ip_address() if placement is not None and placement.spans_nodes else None
        # served here for the group's lifetime (ranks may create groups later)
        self._store = RendezvousServer() if host is None else RendezvousServer(host)
        args = (self._store.host, self._store.port, run_dir, topology)
        if pool is None:
            self.workers = [
                self.worker_actor.options(num_cpus=0, runtime_env=actor_runtime_env("policy", spec, env), name=None,
                                          **({} if placement is None else placement.options(self.role, r))).remote(
                    spec, r, self.world, *args
                )
                for r in range(self.world)
            ]
        else:
            self.workers = pool.acquire("policy", self.world)
        try:
            if pool is None:
                self.ready_info = self._gather([w.ready.remote() for w in self.workers], "ready")
            else:
                self.ready_info = self._gather(
                    [w.adopt.remote(env, spec, r, self.world, *args) for r, w in enumerate(self.workers)],
                    "ready")
        except BaseException:
            self._clean = False
            self.shutdown()
            raise
        last = spec.policy.pp - 1
        self.metrics_rank = next(
            r for r, c in enumerate(self.coords) if c["pp"] == last and c["tp"] == 0 and c["cp"] == 0 and c["dp"] == 0
        )
        self.output_ranks = [
            next(
                r
                for r, c in enumerate(self.coords)
                if c["pp"] == last and c["tp"] == 0 and c["cp"] == 0 and c["dp"] == d
            )
            for d in range(self.dp)
        ]

    # -- fan-out ----------------------------------------------------------------------

    def _gather(self, refs: list, method: str) -> list:
        """Results in rank order, or one error that names the root cause.

        Waits on all ranks together. A dead actor is the root cause over the
        collective errors it provokes on its peers, so it is reported first;
        once a death is seen, peers get ``DEATH_GRACE_S`` to finish before the
        call fails (a peer blocked in a collective with the dead rank would
        otherwise wait for the backend's long timeout).
        """
        index = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        errors: dict[int, tuple[str, BaseException]] = {}   # in the order the driver saw them
        pending, deadline = list(refs), None
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not done:
                break  # grace period over: the rest are stuck behind the dead rank
            rank = index[done[0]]
            try:
                results[rank] = ray.get(done[0])
            except ray.exceptions.RayActorError as exc:
                errors[rank] = ("died", exc)
                deadline = deadline or time.monotonic() + DEATH_GRACE_S
            except ray.exceptions.RayTaskError as exc:
                errors[rank] = ("failed", exc)
        if errors or pending:
            self._clean = False
            texts = {r: own_error_text(exc) for r, (_, exc) in errors.items()}
            first = first_failure(errors, texts)
            kind, exc = errors[first]
            peers = [f"rank {r} {errors[r][0]}: {texts[r]}" for r in errors if r != first]
            peers += [f"rank {index[p]} stalled" for p in pending]
            raise RuntimeError(
                f"{self.role} worker {first} (rank {first}, coords {self.coords[first]}) {kind} during {method}: "
                f"{texts[first]}" + (f"; consequences on its peers: {'; '.join(peers)}" if peers else "")
            ) from exc
        return [results[r] for r in range(len(refs))]

    def _all(self, method: str, *args: Any, **kwargs: Any) -> list:
        return self._gather([getattr(w, method).remote(*args, **kwargs) for w in self.workers], method)

    def _sharded(self, method: str, batch: Mapping[str, torch.Tensor], **kwargs: Any) -> list:
        shard_refs = [ray.put(shard_for_dp(batch, self.dp, d)) for d in range(self.dp)]
        return self._gather(
            [getattr(w, method).remote(shard_refs[self.coords[r]["dp"]], **kwargs) for r, w in enumerate(self.workers)],
            method,
        )

    # -- API ----------------------------------------------------------------------------------

    def train(self, batch: Mapping[str, torch.Tensor], eval_mode: bool = False) -> dict[str, float]:
        return self._sharded("train", batch, eval_mode=eval_mode)[self.metrics_rank]

    def begin_train_step(self) -> None:
        self._all("begin_train_step")

    def train_microbatch(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        return self._sharded("train_microbatch", batch)[self.metrics_rank]

    def finish_train_step(self) -> dict[str, float]:
        return self._all("finish_train_step")[self.metrics_rank]

    def abort_train_step(self) -> None:
        self._all("abort_train_step")

    # -- data-plane variants: only keys cross the driver ---------------------------------

    def logprobs_by_key(self, dataplane: Any, key: str, out_key: str, *, reference: bool = False) -> str:
        """Workers fetch their shard of ``key`` and stage logprobs under ``out_key/dp<d>``."""
        field = "reference_policy_logprobs" if reference else "prev_logprobs"
        self._all("logprobs_to_dataplane", dataplane, key, out_key, field, reference)
        return out_key

    def train_by_key(self, dataplane: Any, key: str, extra_keys: list[str]) -> dict[str, float]:
        """``train`` on the batch staged under ``key`` plus the per-shard ``extra_keys``."""
        return self._all("train_from_dataplane", dataplane, key, list(extra_keys))[self.metrics_rank]

    def get_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        out = self._sharded("get_logprobs", batch)
        return torch.cat([out[r] for r in self.output_ranks])

    def get_reference_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        out = self._sharded("get_reference_logprobs", batch)
        return torch.cat([out[r] for r in self.output_ranks])

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return self._all("hf_state_dict")[0]

    def parameter_checksums(self) -> dict[str, list[float]]:
        return self._all("parameter_checksums")[0]

    def stream_weights(self, transport: str, **kw: Any) -> Any:
        return self._all("stream_weights", transport, **kw)[0]

    def save_checkpoint(self, directory: str) -> None:
        self._all("save_checkpoint", str(directory))

    def load_checkpoint(self, directory: str) -> None:
        self._all("load_checkpoint", str(directory))

    def shutdown(self) -> None:
        """Close profilers and process groups, kill the actors, stop Ray if we
        started it. Safe to call twice."""
        workers, self.workers = getattr(self, "workers", []), []
        pool = getattr(self, "_pool", None)
        refs = []
        for w in workers:
            try:
                refs.append(w.retire.remote() if pool is not None else w.shutdown.remote())
            except Exception:  # noqa: BLE001 - best-effort shutdown
                self._clean = False
        try:  # one bound for all ranks (a dead raylet answers none of them)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=30)
            if pool is not None and self._clean and len(ready) == len(workers):
                ray.get(ready)  # raises if a rank did not retire cleanly
                pool.release("policy", workers)
                workers = []
        except Exception:  # noqa: BLE001 - best-effort shutdown; the processes are killed below
            pass
        for w in workers:
            try:
                ray.kill(w)
            except Exception:  # noqa: BLE001 - best-effort shutdown
                pass
        store = getattr(self, "_store", None)
        if store is not None:
            store.close()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False
