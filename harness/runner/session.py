"""The live part of a run: Ray, workers, data plane, trainer; torn down on exit.

``Session`` is a context manager. ``__enter__`` starts, in order: Ray (a private
local instance with a zygote of its own that the run's workers fork from, or the cluster
at ``ray_address`` joined: ``harness.runner.cluster``; docs/runner.md, "Cold"),
the placement group of a cold run (``harness.runner.placement``: every rank pinned to
its planned slot, actors at ``num_cpus=0``), the data plane
and capture ledger (when capture is on), the policy worker group, the rollout
workers (engine-init windows close inside them; a cold cuda run with native engines
creates them before the policy group, so both start at once), ``placement.json`` (where each
rank actually runs), and an initial refit so the
engines hold exactly the policy's weights (weight version 1). ``__exit__``
shuts everything down in reverse order whatever happened, then Ray itself (a
joined cluster: this driver only disconnects).
A reaper (``harness.runner.reaper``) started before Ray kills whatever a run
leaves behind: after ``ray.shutdown``, and when this driver dies (SIGKILL included).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

import ray
import torch

from harness.artifacts import layout
from harness.grpo.episodes import make_episode_env
from harness.grpo.refitter import Refitter
from harness.grpo.rollouts import RolloutDriver
from harness.portable import enter_process
from harness.progress import phase
from harness.progress import step as step_progress
from harness.registry import rollout as rollout_registry
from harness.registry.trainer import trainer_class
from harness.spec.runplan import RunPlan

SHUTDOWN_TIMEOUT_S = 60


def deterministic_driver() -> None:
    """``torch.use_deterministic_algorithms(True)`` for the driver, without importing
    ``torch._inductor``: the public call imports it (and dynamo with it) only to set inductor's
    own ``deterministic`` option, 1-2 s of CPU on the 2-core box, in a process that compiles
    nothing. The flag the kernels read is set the same way (``torch._C``); where torch lacks
    that function, or inductor is already imported, the public call sets both."""
    set_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_flag is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True)
    else:
        set_flag(True, warn_only=False)


class Session:
    def __init__(self, run_plan: RunPlan, run_dir: Path, env_vars: dict[str, str],
                 say: Callable[[str], None], resume: tuple[Path, dict] | None = None, warm=None) -> None:
        """``run_plan``: the run worked out once (``harness.spec.runplan``): its typed
        ``workload`` and ``topology`` are the values every worker receives (nothing here
        converts, plans or checks the spec again); its ``ray_address``: join that Ray cluster
        instead of starting a private local instance (``harness.runner.cluster``); its
        ``options``: the run's behaviour switches (``RunOptions``).
        ``resume``: (checkpoint dir, its state) from ``checkpoint.latest``; the
        stores must already be restored (``checkpoint.restore_stores``). ``warm``: a
        ``harness.runner.warm.WarmRuntime`` to take Ray and warm processes from (ignored,
        i.e. a cold start, when ``warm.cold_reason`` names one for this spec, or when
        the plan joins a cluster). Every cold run places its ranks from the plan
        (``harness.runner.placement``)."""
        self.plan = run_plan
        self.spec = run_plan.workload
        self.resume = resume
        self.first_step = 1 if resume is None else int(resume[1]["step"]) + 1
        self.topology = run_plan.topology
        self.run_dir = Path(run_dir)
        self.env_vars = env_vars
        self.say = say
        self.policy = None
        self.teacher = None  # a distillation workload's teacher group (harness.distill.teacher)
        self.workers: list = []
        self.refitter: Refitter | None = None
        self.dataplane_handle = None
        self.dataplane = None
        self.ledger = None
        self._started_ray = False
        self.warm = warm
        self._warm_rollout = False
        self._dataplane_check = None
        self._dataplane_pool = None  # the WarmRuntime whose pooled data-plane process this run uses
        self._dataplane_name: str | None = None
        self._reaper = None
        self._zygote = None  # a cold local run's fork server (harness.runner.zygote), while Ray is up
        self.ray_address = ray_address = run_plan.ray_address
        self.placement = None  # harness.runner.placement.Placement of a cold run
        if ray_address is not None:
            self.warm = None  # a cluster run places fresh actors; the warm pool lives in its own Ray

    # -- start-up ------------------------------------------------------------
    def __enter__(self) -> Self:
        try:
            self._start()
        except BaseException:
            self._stop(failed=True)
            raise
        return self

    def _start(self) -> None:
        from harness.workerenv import select as worker_env

        worker_pythons = worker_env.worker_pythons(self.spec)  # refuses an unusable built environment
        if not worker_env.in_worker_env("rollout"):  # else the rollout workers' environment answers for it
            rollout_registry.preflight(self.spec.rollout.backend)  # a clear error before any actor starts
        torch.set_num_threads(1)
        deterministic_driver()
        enter_process(self.spec.platform.device)  # the driver's own CPU math (advantages) runs pinned too
        from harness.runner import warm as warm_pool

        pool = None  # the warm processes this run's policy adopts (None: fresh ones)
        rollout_pool = None  # the warm processes its rollout actors adopt (None: fresh ones)
        shared = self.warm is not None and warm_pool.private_ray_reason(self.spec) is None
        if self.warm is not None:
            selected = (f"{worker_env.SELECT_ENV}={worker_env.selection()}: workers start in their backends' "
                        "environments" if worker_env.selection() != worker_env.CURRENT else None)
            reason = warm_pool.cold_reason(self.spec) or selected
            if shared and selected is None:  # only the policy backend keeps state in fresh processes
                rollout_pool = self.warm
            if reason is None:
                pool = self.warm
            elif rollout_pool is not None:
                self.say(f"cold start of the policy ranks (fresh processes, shared Ray; rollout engines from the "
                         f"pool): {reason}")
            else:
                self.say(f"cold start{' (fresh processes, shared Ray)' if shared else ''}: {reason}")
        if shared:
            t = time.perf_counter()
            phase(self.say, "starting Ray (shared)" if not self.warm.ray_up() else "reusing Ray")
            if self.warm.ensure_ray(self.say):
                self.say(f"ray up in {time.perf_counter() - t:.1f}s (shared by the workloads of this process)")
            else:
                self.say(f"reusing Ray and {sum(self.warm.idle().values())} warm worker process(es)")
            self._dataplane_pool = self.warm  # the data plane holds no workload code: pooled in a shared Ray
        else:
            warm_pool.step_aside()  # a warm runtime's Ray carries no job runtime_env of this run
        if not shared and not ray.is_initialized():
            t = time.perf_counter()
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            runtime_env: dict = {"env_vars": self.env_vars}
            hook = os.environ.get("GOLDEN_WORKER_SETUP_HOOK")
            if hook:  # instrumentation/mutation entry point for every Ray worker process
                runtime_env["worker_process_setup_hook"] = hook
            on_main_thread = threading.current_thread() is threading.main_thread()
            sigterm = signal.getsignal(signal.SIGTERM) if on_main_thread else None
            self._start_reaper()  # before ray.init: every Ray process of the run inherits the token
            phase(self.say, "starting Ray" if self.ray_address is None else f"joining Ray at {self.ray_address}")
            if os.environ.get("RAY_ADDRESS") and self.ray_address is None:
                self.say(f"RAY_ADDRESS={os.environ['RAY_ADDRESS']} is ignored: a golden run starts its own "
                         "local Ray instance (no shared cluster, no other jobs' actors)")
            from harness.runner.cluster import init_ray

            extra = self._start_zygote()  # after the reaper (it carries the token); imports while Ray starts
            init_ray(self.spec, self.ray_address, log_to_driver=self.plan.options.worker_logs,
                     runtime_env=runtime_env, **extra)
            if sigterm is not None:  # ray.init replaces it with sys.exit(15); the caller's shutdown path wins
                signal.signal(signal.SIGTERM, sigterm)
            self._started_ray = True
            if self._zygote is not None:
                worker_env.set_warm_runtime_env(self._forked)
            self.say(f"ray up in {time.perf_counter() - t:.1f}s")
        if not shared:
            from harness.runner.placement import Placement

            phase(self.say, f"placing {len(self.topology.nodes)} planned node(s)")
            self.placement = Placement.create(self.spec, self.topology.to_dict(),
                                              where=f"ray cluster {self.ray_address or 'local'}",
                                              local=self.ray_address is None)
        from harness.envs.tasks import PromptLoader, make_task
        from harness.envs.tokenizer import load_tokenizer

        spec = self.spec
        self.tokenizer = load_tokenizer()
        task = make_task(spec.env.task, spec.seed)
        self.loader = PromptLoader(task, spec.grpo.prompts_per_step, spec.seed)
        self.episode_env = make_episode_env(spec.env, task, self.tokenizer)
        capture = self._start_capture()
        beside = rollout_registry.rollout_backend(spec.rollout.backend).starts_beside_policy_on_cuda
        if rollout_pool is None and spec.platform.device == "cuda" and beside:
            # the native engines start (imports, weights, probe) while the policy ranks do: on a
            # GPU host both are mostly per-process CPU work. The CPU keeps one after the other
            # (its few cores are shared by every rank), and so does vLLM (its start-up sizes
            # its cache from the GPU memory left free, which a starting policy still takes)
            phase(self.say, f"spawning {len(self.topology.engines)} rollout engine(s) beside the policy")
            self._spawn_rollout_actors()
        phase(self.say, f"spawning {self.topology.policy.world} policy workers")
        from harness.policy.group import PolicyGroup

        self.policy = PolicyGroup(spec, self.topology, self.run_dir, env_vars=self.env_vars, pool=pool,
                                  placement=self.placement)
        self._detail("policy workers", self.policy.ready_info)
        if spec.distill is not None:
            from harness.distill.teacher import TeacherGroup

            phase(self.say, f"spawning {self.topology.teacher.world} teacher workers")
            self.teacher = TeacherGroup(self.plan.teacher, self.topology, self.run_dir, env_vars=self.env_vars,
                                        placement=self.placement)
            self._detail("teacher workers", self.teacher.ready_info)
        phase(self.say, f"spawning {len(self.topology.engines)} rollout engine(s), tp={spec.rollout.tp}")
        if rollout_pool is None:
            if not self.workers:
                self._spawn_rollout_actors()
            ready = ray.get([w.ready.remote() for w in self.workers])
        else:
            self.workers = rollout_pool.acquire("rollout", len(self.topology.engines))
            self._warm_rollout = True
            ready = ray.get([w.adopt.remote(self.env_vars, spec, engine.engine, engine.rank_prefix, str(self.run_dir),
                                            capture_config=self._capture_config)
                             for w, engine in zip(self.workers, self.topology.engines)])
        self._detail("rollout workers", ready)
        _record_worker_pythons(self.run_dir, worker_env.selection(), worker_pythons, self.policy.ready_info, ready)
        if self.placement is not None:
            self.placement.record(self.run_dir, self.policy.workers, self.workers,
                                  teacher_workers=self.teacher.workers if self.teacher is not None else ())
        self._await_dataplane()
        self.refitter = Refitter(spec, self.policy, self.workers, self.run_dir, topology=self.topology)
        if self.placement is not None and self.placement.spans_nodes:
            self.refitter.store_host = ray.util.get_node_ip_address()  # reachable from every node
        if self.resume is not None:
            ckpt, state = self.resume
            self.say(f"resuming after step {state['step']} from {ckpt}")
            self.policy.load_checkpoint(str(ckpt / "policy"))
            self.loader.load_state_dict(state["loader"])
            self.refitter.refit(state["step"])
            ray.get([w.set_weight_version.remote(state["weight_version"]) for w in self.workers])
        else:
            phase(self.say, "initial refit (policy weights to the engines)")
            self.refitter.refit(0)
        self.driver = RolloutDriver(spec, self.workers, self.tokenizer, self.episode_env, capture)
        cls = trainer_class(spec.grpo.trainer)
        extra = {"teacher": self.teacher} if self.teacher is not None else {}
        self.trainer = cls(spec, self.policy, self.workers, self.driver, self.loader, self.tokenizer,
                           self.episode_env, self.refitter.refit, dataplane=self.dataplane, **extra)

    def _spawn_rollout_actors(self) -> None:
        """Create a cold run's rollout worker actors (``self.workers``); their start-up runs
        in their own processes until ``ready()`` is awaited."""
        from harness.rollout.worker import rollout_worker_actor
        from harness.workerenv import select as worker_env

        spec = self.spec
        actor_cls = rollout_worker_actor()
        for engine in self.topology.engines:
            placed = {} if self.placement is None else self.placement.options("rollout", engine.rank_prefix)
            w = actor_cls.options(runtime_env=worker_env.actor_runtime_env("rollout", spec, self.env_vars),
                                  **placed).remote(
                spec, engine.engine, engine.rank_prefix, str(self.run_dir), env_vars=self.env_vars,
                capture_config=self._capture_config,
            )
            self.workers.append(w)

    def _detail(self, what: str, ready: list[dict]) -> None:
        """The workers' ``ready()`` records (pids, start-up stamps in ``timings``) to a reporter
        that records them (``say.detail(what, records)``: the phase bench, the warm-isolation
        test); nothing otherwise."""
        detail = getattr(self.say, "detail", None)
        if detail is not None:
            detail(what, list(ready))

    def _await_dataplane(self) -> None:
        """The data-plane actor started by ``_start_capture`` is up and serves this run's file."""
        check, self._dataplane_check = self._dataplane_check, None
        if check is not None:
            ref, path, name = check
            actual = ray.get(ref)
            if actual != path:
                raise ValueError(f"data plane actor {name!r} already serves {actual}, not {path}")

    def _start_reaper(self) -> None:
        """A reaper that SIGKILLs the run's processes once this driver is gone (runner/reaper.py)."""
        from harness.runner.reaper import start_reaper

        self._reaper = start_reaper()

    def _stop_reaper(self) -> None:
        from harness.runner.reaper import stop_reaper

        if self._reaper is not None:
            stop_reaper(self._reaper)
            self._reaper = None

    def _start_zygote(self) -> dict:
        """A cold local run's fork server (``harness.runner.zygote``, as a warm runtime has one):
        every policy, rollout and data-plane worker of this run whose start-up environment is the
        runner's own forks from it (``warm.forked_runtime_env``) instead of importing torch
        itself; a forked worker is what a fresh interpreter is to a workload (docs/runner.md).
        None (fresh interpreters) for the reasons ``warm.cold_zygote_reason`` names. Returns the
        extra ``ray.init`` arguments (``warm.FORKED_WORKERS_RAY_CONFIG``)."""
        from harness.runner import warm as warm_pool

        reason = warm_pool.cold_zygote_reason(self.spec, self.ray_address)
        if reason is not None:
            return {}
        from harness.runner.zygote import Zygote

        self._zygote = Zygote({**os.environ, **warm_pool.BASE_ENV})
        return {"_system_config": dict(warm_pool.FORKED_WORKERS_RAY_CONFIG)}

    def _forked(self, runtime_env: dict, flavour: str | None = None) -> dict:
        """``runtime_env`` of a worker of this cold run: forked from its zygote (or that zygote's
        ``flavour``, a policy backend's) where it may be; the ``set_warm_runtime_env`` hook."""
        from harness.runner.warm import forked_runtime_env

        return forked_runtime_env(runtime_env, self._zygote, flavour)

    def _stop_zygote(self) -> None:
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            from harness.workerenv.select import set_warm_runtime_env

            set_warm_runtime_env(None)
            zygote.close()

    def _start_capture(self):
        self._dataplane_check = None
        self._capture_config = None
        self.dataplane = None
        if not self.spec.capture.enabled and self.spec.grpo.trainer != "dataplane":
            return None
        from harness.capture.admission import CaptureAdmitter
        from harness.capture.ledger import CaptureLedger
        from harness.capture.sink import capture_config_from_spec
        from harness.dataplane.actor import DataPlaneActor, DataPlaneClient

        phase(self.say, "starting the data plane")
        path = str(self.run_dir / layout.DATAPLANE)
        # Not waited for here: the actor's process starts while the workers do; _await_dataplane
        # checks it (as start_dataplane_actor would) once they are up, before the first refit.
        if self._dataplane_pool is not None:  # the warm runtime's pooled process opens this run's new file
            self.dataplane_handle, name = self._dataplane_pool.acquire_dataplane()
            self._dataplane_name = name
            self._dataplane_check = (self.dataplane_handle.open.remote(path), path, name)
        else:
            name = f"dataplane-{self.run_dir.name}-{os.getpid()}"
            pin = {} if self.placement is None else self.placement.driver_node_options()  # beside the driver's reads
            if self._zygote is not None:  # a cold run's fork server: no torch import in the actor's process
                pin["runtime_env"] = self._forked({"env_vars": dict(self.env_vars)})
            self.dataplane_handle = DataPlaneActor.options(name=name, get_if_exists=True, **pin).remote(path)
            self._dataplane_check = (self.dataplane_handle.path.remote(), path, name)
        self.dataplane = DataPlaneClient(self.dataplane_handle)
        if not self.spec.capture.enabled:
            return None
        self._capture_config = capture_config_from_spec(self.spec, self.run_dir, dataplane_actor=name)
        self.ledger = CaptureLedger(str(self.run_dir / layout.LEDGER))
        admitter = CaptureAdmitter(self.ledger, self.dataplane, tokenizer=self.tokenizer,
                                   eos_token_id=self.tokenizer.eos_token_id)
        return (admitter, self.ledger, self.dataplane)

    # -- the loop --------------------------------------------------------------
    def run_iterations(self) -> None:
        iterations = self.spec.grpo.iterations
        every = self.spec.grpo.checkpoint_every
        for step in range(self.first_step, iterations + 1):
            t = time.perf_counter()
            step_progress(self.say, step, iterations)
            out = self.trainer.step(step)
            _append_jsonl(self.run_dir / layout.METRICS,
                          [{"step": step, "metrics": out.metrics, "timings": out.timings}])
            if self.spec.capture.enabled:
                _append_jsonl(self.run_dir / layout.ROLLOUTS, out.summaries)
            self.say(f"step {step}/{iterations}: loss={out.metrics.get('loss', float('nan')):.5f} "
                     f"reward={out.metrics.get('reward', float('nan')):.3f} ({time.perf_counter() - t:.1f}s)")
            if every and step % every == 0 and step < iterations:
                from harness.runner import checkpoint

                checkpoint.save(self.run_dir, step, policy=self.policy, dataplane=self.dataplane,
                                ledger=self.ledger, loader=self.loader,
                                weight_version=self.refitter.history[-1]["version"])

    # -- teardown --------------------------------------------------------------
    def __exit__(self, *exc) -> None:
        self._stop(failed=exc[0] is not None)

    def _stop(self, failed: bool = False) -> None:
        """Tear down in reverse order. Warm processes (``warm``) go back to the pool only
        when the run did not fail and each retired cleanly; any other is killed."""
        phase(self.say, "shutting down workers and Ray")
        errors = []
        if failed and self.policy is not None:
            self.policy._clean = False  # never pool a process of a failed run
        for w in self.workers:
            try:
                if self._warm_rollout and not failed:
                    ray.get(w.retire.remote(), timeout=SHUTDOWN_TIMEOUT_S)
                    self.warm.release("rollout", [w])  # retired cleanly: reusable
                    continue
                ray.get((w.retire if self._warm_rollout else w.shutdown).remote(), timeout=SHUTDOWN_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - keep tearing down
                errors.append(f"rollout worker shutdown: {e!r}")
            try:
                ray.kill(w)
            except Exception:  # noqa: BLE001
                pass
        if self.policy is not None:
            try:
                self.policy.shutdown()
            except Exception as e:  # noqa: BLE001
                errors.append(f"policy shutdown: {e!r}")
        if self.teacher is not None:
            try:
                self.teacher.shutdown()
            except Exception as e:  # noqa: BLE001
                errors.append(f"teacher shutdown: {e!r}")
        if self.refitter is not None:  # the side group's store, after every member closed its group
            self.refitter.close()
        if self.ledger is not None:
            self.ledger.close()
        if self.dataplane is not None:  # the driver's local read connection, before the actor's
            try:
                self.dataplane.close()
            except Exception as e:  # noqa: BLE001 - keep tearing down
                errors.append(f"data plane client close: {e!r}")
        if self.dataplane_handle is not None:
            try:
                ray.get(self.dataplane_handle.close.remote(), timeout=SHUTDOWN_TIMEOUT_S)
                if self._dataplane_pool is not None and not failed and self._dataplane_check is None:
                    self._dataplane_pool.release_dataplane(self.dataplane_handle, self._dataplane_name)
                else:  # a cold run's, or one whose run failed or never checked it: never reused
                    ray.kill(self.dataplane_handle)
            except Exception as e:  # noqa: BLE001
                errors.append(f"data plane shutdown: {e!r}")
                try:
                    ray.kill(self.dataplane_handle)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        if self.placement is not None:
            self.placement.remove()
        if self._started_ray:
            ray.shutdown()  # a joined cluster: this driver disconnects, the cluster keeps running
        self._stop_zygote()
        self._stop_reaper()
        if errors:
            self.say("teardown problems: " + "; ".join(errors))


def _record_worker_pythons(run_dir: Path, chosen: str, wanted: dict[str, str], policy: list[dict],
                           rollout: list[dict]) -> None:
    """``worker_envs.json``: the selection, the interpreter each role was to run and the one each
    worker reported (``ready()["python"]``). A run artifact, not a gated surface."""
    from harness.workerenv.select import RECORD

    doc = {"selection": chosen, "wanted": wanted,
           "policy": [{"rank": r.get("rank"), "python": r.get("python")} for r in policy],
           "rollout": [{"engine": r.get("engine_index"), "python": r.get("python")} for r in rollout]}
    wrong = [(role, w) for role, ws in (("policy", doc["policy"]), ("rollout", doc["rollout"]))
             for w in ws if w["python"] != wanted[role]]
    (run_dir / RECORD).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    if wrong:
        role, w = wrong[0]
        raise RuntimeError(f"{role} worker {w} runs {w['python']}, not its environment's {wanted[role]}")


def _finite_or_text(value):
    """JSON has no NaN/inf: keep them visible as text (the training surface flags them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _finite_or_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_text(v) for v in value]
    return value


def _append_jsonl(path: Path, records: list[dict]) -> None:
    with open(path, "a") as fh:
        fh.writelines(json.dumps(_finite_or_text(rec), sort_keys=True, allow_nan=False) + "\n" for rec in records)
        fh.flush()
        os.fsync(fh.fileno())
