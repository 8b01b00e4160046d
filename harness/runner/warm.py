"""Start-up paid once per gate run: one Ray instance and a pool of warm worker processes.

A cold golden run (the CLI's ``golden check``) starts Ray, spawns every policy
rank and rollout actor as a new process that imports torch, and tears it all
down again. A ``WarmRuntime`` (the pytest plugin holds one per pytest process,
so one per xdist worker) keeps, between consecutive workloads of that process:

* the Ray instance (started on first use, local, like the cold one, with no
  workload's environment in its job ``runtime_env``);
* idle *warm processes*: ``PolicyWorkerHost`` and ``RolloutWorkerHost`` actors
  (torch imported, nothing of a workload in them). A workload's
  ``PolicyGroup`` / rollout workers ``acquire`` as many as they need (new ones
  are started when the pool has too few), ``adopt`` them (fresh-process state
  restored by ``harness.runner.process_state``, the workload's environment
  applied, then new process groups, model, optimizer, seeds and profilers), and
  ``release`` them after every one retired cleanly. A process whose workload
  failed in any way is killed, never pooled.

Every worker the runtime's Ray starts for a pool, every fresh policy or
rollout worker of a workload that is not pooled (its policy ranks from the
zygote's flavour of their backend where it has one) and each workload's
data-plane actor fork from the runtime's
*zygote* (``harness.runner.zygote``, started with Ray, torch and the worker
modules imported, never ray) when :func:`zygote_runtime_env` allows it: its
start-up environment holds only the runner's own variables. A forked worker
is what a fresh interpreter is to a workload (``suites/integration/test_zygote.py``);
it costs a fork instead of a torch import. ``GOLDEN_ZYGOTE=0`` turns it off.

The data-plane actor's process is pooled too (:meth:`WarmRuntime.acquire_dataplane`): it
opens each workload's new staging file and closes it at the end; it runs no workload code.

What is not pooled: internal rollout engine processes
(``rollout.tp > 1`` or async) and rendezvous stores (all per workload), and
whole workloads that :func:`cold_reason` names. The megatron and dtensor policy
backends (megatron-core keeps its parallel state in module globals, DTensor its device
meshes) get fresh policy ranks in the runtime's Ray, beside pooled rollout processes.
A device other than the CPU, the vLLM rollout backend, and a worker setup hook
(``GOLDEN_WORKER_SETUP_HOOK``: Ray's job-level ``worker_process_setup_hook``) outside ``harness.mutations.WARM_SAFE``
(:func:`private_ray_reason`) need a Ray instance of their own: such a run, like
any run without a runtime, is cold, and :func:`step_aside` first shuts down a
warm runtime's Ray so the cold run starts its own instance with its own job
``runtime_env``; the runtime starts again on its next use.

Planted regressions run warm: a hook of ``harness.mutations.WARM_SAFE`` (they
patch only module functions and plain classes that policy and rollout processes
look up at call time) is applied by :meth:`WarmRuntime.acquire` in every process
it hands out, before the workload adopts it, as Ray applies it in a fresh worker
before the actor exists. Such a process is *tainted*: after its workload
retired it, :meth:`WarmRuntime.release` has it undo the hook (``harness.mutations.undo``
puts back every attribute a mutation replaced and checks it is the original
object) and pools it again; one whose undo fails is killed and a clean
replacement starts at once. The fresh processes such a workload starts beside the
pool (a distillation teacher's ranks) run the hook in the zygote's child before
their worker starts (:func:`zygote_runtime_env`), as Ray runs it in a cold run.

The runtime never outlives its owner's Ray: actors are ordinary (not
detached) actors of the driver's job, and the runtime starts a reaper
(``harness.runner.reaper``, as a cold ``Session`` does) before its ``ray.init``,
so ``close`` or a driver that dies, even SIGKILLed, leaves no process of its
Ray, pool included.

Imports of ray happen inside the methods (the pytest plugin is gate half).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.code_identity import DIGEST_VAR, ROOT_VAR
from harness.portable.pins import MARK_VAR as PIN_MARK
from harness.portable.pins import PINS
from harness.registry.policy import policy_backend
from harness.registry.rollout import rollout_backend
from harness.spec.runplan import SWITCHES

if TYPE_CHECKING:
    from harness.spec.typed import Workload

BASE_ENV = {"RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
KINDS = ("policy", "rollout")
HOOK_VAR = "GOLDEN_WORKER_SETUP_HOOK"
WARM_HOOKS = "harness.mutations."  # with harness.mutations.WARM_SAFE: hooks that may run warm
WARM_ENV = "GOLDEN_WARM"  # "0": the pytest plugin runs every workload cold
# Workers the raylet starts at once (Ray's default: the number of cores, so 2 here). A worker
# forked from the zygote costs a fork and Ray's own start-up, so the flagship's eight ranks and
# its rollout actor start together instead of two by two.
STARTUP_CONCURRENCY = 16
# The Ray settings of an instance whose workers fork from a zygote: start them all at once, and
# prestart no idle default workers (Ray starts one per logical CPU for the first driver; an actor
# forked from the zygote has a runtime_env of its own, so none of them would ever be used).
FORKED_WORKERS_RAY_CONFIG = {"worker_maximum_startup_concurrency": STARTUP_CONCURRENCY,
                             "enable_worker_prestart": False, "prestart_worker_first_driver": False}
ZYGOTE_ENV = "GOLDEN_ZYGOTE"  # "0": the runtime's workers start as fresh interpreters (no fork server)
# The variables a worker may start with and still be forked by the zygote: the runner's own
# (harness.runner.run.worker_env, BASE_ENV), which nothing the zygote preloads reads at import.
# A workload's plugins.env may name anything (a TORCH_* variable read at import): such workers
# start as fresh interpreters.
# HARNESS_TRACE_ROLE (a distillation teacher's ranks) and the resume segment variables are read
# when a profiler is built, never at import.
# The CPU numerics pins (harness.portable.pins) are the zygote's own too: it starts pinned.
# The run options' carriers (harness.spec.runplan.SWITCHES) are read when an engine or a process
# group is built, never at import.
ZYGOTE_START_VARS = frozenset({*BASE_ENV, *PINS, PIN_MARK, "HARNESS_TRACE_DIR", "HARNESS_RUN_ID",
                               "NRL_POLICY_PROFILER_CLASS", "NRL_ROLLOUT_PROFILER_CLASS", "HARNESS_TRACE_ROLE",
                               "HARNESS_TRACE_SEGMENT", "HARNESS_STEP_OFFSET", DIGEST_VAR, ROOT_VAR,
                               *(var for _name, _kind, var, _what in SWITCHES if var is not None)})

_current: WarmRuntime | None = None  # the runtime whose Ray is up in this process
_lock = threading.Lock()


def setup_hook(environ: dict[str, str] | None = None) -> str | None:
    """The worker setup hook (``module.function``) a run carries, or None."""
    env = os.environ if environ is None else environ
    return (env.get(HOOK_VAR) or "").strip() or None


def hook_runs_warm(hook: str) -> bool:
    """Whether the setup hook ``hook`` may run in warm processes: a ``harness.mutations``
    function listed in its ``WARM_SAFE`` (it patches nothing that Ray froze in an actor class)."""
    if not hook.startswith(WARM_HOOKS):
        return False
    from harness.mutations import WARM_SAFE  # standard library only

    return hook[len(WARM_HOOKS):] in WARM_SAFE


def private_ray_reason(spec: Workload, environ: dict[str, str] | None = None) -> str | None:
    """Why ``spec`` needs a Ray instance of its own (job-level settings), or None."""
    hook = setup_hook(environ)
    if hook and not hook_runs_warm(hook):
        return (f"{HOOK_VAR}={hook} is a job-level worker setup hook (only harness.mutations.WARM_SAFE "
                "runs in warm processes)")
    if spec.platform.device != "cpu":
        return f"platform.device is {spec.platform.device!r} (the warm runtime is CPU only)"
    if not rollout_backend(spec.rollout.backend).warm:  # harness.registry.rollout
        return f"rollout.backend is {spec.rollout.backend!r}"
    if hook and _fresh_reason(spec) is not None:  # fresh processes in a shared Ray would not run it
        return f"{HOOK_VAR} is set and {_fresh_reason(spec)}"
    env = os.environ if environ is None else environ
    if hook and spec.distill is not None and env.get(ZYGOTE_ENV, "1").strip() == "0":
        # the teacher's fresh ranks run the hook only when forked from the zygote (zygote_runtime_env)
        return f"{HOOK_VAR} is set, the distillation teacher's ranks are fresh processes and {ZYGOTE_ENV}=0"
    if hook:
        from harness.workerenv import select  # standard library only

        chosen = select.selection(environ=environ)
        if chosen != select.CURRENT:  # the session then starts fresh workers, which would not run it
            return f"{HOOK_VAR} is set and {select.SELECT_ENV}={chosen} (fresh workers in their environments)"
    return None


def _fresh_reason(spec: Workload) -> str | None:
    """Why the policy backend needs fresh worker processes (``harness.registry.policy``), or None."""
    cold = policy_backend(spec.policy.backend).cold
    if cold:
        return f"policy.backend is {spec.policy.backend!r} ({cold})"
    return None


def cold_reason(spec: Workload, environ: dict[str, str] | None = None) -> str | None:
    """Why ``spec`` must run in fresh worker processes (not the pool's), or None when it may
    run warm. Every :func:`private_ray_reason` is one (then no process is pooled); a policy
    backend that keeps state in module globals (megatron, dtensor) shares Ray and the pooled
    rollout and data-plane processes, but gets fresh policy ranks (``Session``): that state
    lives only in the policy ranks, and its rollout engines are the native ones every pooled
    workload uses (warm vs cold byte-identity: ``benches/warm_isolation.py``)."""
    private = private_ray_reason(spec, environ)
    if private is not None:
        return private
    return _fresh_reason(spec)


def zygote_runtime_env(runtime_env: dict, flavour: str | None = None) -> dict:
    """``runtime_env`` for a fresh actor of a workload in this process's warm runtime
    (``harness.workerenv.select.actor_runtime_env``: the ranks of a backend that is never pooled,
    a distillation teacher's ranks), with the runtime's zygote (``harness.runner.zygote``) as its
    ``py_executable`` when one is up and the actor may be forked from it
    (:func:`forked_runtime_env`). ``flavour`` (a policy backend's name): fork it from that flavour
    of the zygote (``zygote.FLAVOURS``) when there is one. Unchanged otherwise (no warm runtime).

    With a setup hook set (:func:`setup_hook`: only a ``WARM_SAFE`` one reaches a shared Ray,
    :func:`private_ray_reason`), the forked worker runs it before its worker script starts
    (``zygote.HOOK_VAR``), as Ray runs a cold run's job-level hook in a fresh worker; an actor
    that cannot be forked would start without it: RuntimeError."""
    runtime = _current
    forked = forked_runtime_env(runtime_env, runtime._zygote if runtime is not None else None, flavour)
    hook = setup_hook()
    if hook is None or runtime is None:
        return forked
    if forked is runtime_env:
        raise RuntimeError(f"{HOOK_VAR}={hook}: a fresh worker of this run cannot be forked from the warm "
                           "runtime's zygote, so it would start without the setup hook")
    from harness.runner.zygote import HOOK_VAR as ZYGOTE_HOOK_VAR

    forked["env_vars"][ZYGOTE_HOOK_VAR] = hook
    return forked


def _pool_runtime_env() -> dict:
    """``runtime_env`` of a pool process or a pooled data-plane actor: the runtime's zygote, never
    a setup hook (a pool process runs one only when acquired, :meth:`WarmRuntime.acquire`)."""
    runtime = _current
    return forked_runtime_env({"env_vars": dict(BASE_ENV)}, runtime._zygote if runtime is not None else None)


def forked_runtime_env(runtime_env: dict, zygote, flavour: str | None = None) -> dict:
    """``runtime_env`` with ``zygote`` (a ``harness.runner.zygote.Zygote``, or None) as its
    ``py_executable`` when it is alive and the actor may be forked from it: no
    ``py_executable`` of its own (a built worker environment) and only
    :data:`ZYGOTE_START_VARS` in its ``env_vars``; ``flavour``: from that flavour of the zygote
    where it has one (else the zygote itself). Unchanged otherwise."""
    env_vars = runtime_env.get("env_vars") or {}
    if (zygote is None or not zygote.alive() or "py_executable" in runtime_env
            or set(runtime_env) - {"env_vars"} or set(env_vars) - ZYGOTE_START_VARS):
        return runtime_env
    from harness.runner.zygote import ADDRESS_VAR, worker_command

    address = (zygote.flavour(flavour) if flavour else None) or zygote.address
    return {"env_vars": {**env_vars, ADDRESS_VAR: address}, "py_executable": worker_command()}


def cold_zygote_reason(spec: Workload, ray_address: str | None = None,
                       environ: dict[str, str] | None = None) -> str | None:
    """Why a cold run of ``spec`` starts its workers as fresh interpreters instead of forking them
    from a zygote of its own, or None: ``GOLDEN_ZYGOTE=0``, a Ray cluster (workers on other nodes
    cannot reach this machine's fork server), a device other than the CPU, a rollout backend
    the warm runtime does not take (vLLM), or a worker environment selected."""
    env = os.environ if environ is None else environ
    if env.get(ZYGOTE_ENV, "1").strip() == "0":
        return f"{ZYGOTE_ENV}=0"
    if ray_address is not None:
        return f"the run joins the Ray cluster at {ray_address}"
    if spec.platform.device != "cpu":
        return f"platform.device is {spec.platform.device!r}"
    if not rollout_backend(spec.rollout.backend).warm:
        return f"rollout.backend is {spec.rollout.backend!r}"
    from harness.workerenv import select  # standard library only

    if select.selection(environ=environ) != select.CURRENT:
        return f"{select.SELECT_ENV}={select.selection(environ=environ)}"
    return None


def step_aside() -> None:
    """Before a cold run: shut down the warm runtime that holds this process's Ray, if any."""
    runtime = _current
    if runtime is not None:
        runtime.close()


def start_local_ray(runtime_env: dict, say: Callable[[str], None] | None = None, *,
                    log_to_driver: bool = False) -> None:
    """A fresh local Ray instance (``address="local"``: ``RAY_ADDRESS`` is not followed), actors
    at ``num_cpus=0`` on a ``num_cpus`` = cores node; the caller's SIGTERM handler survives.
    ``log_to_driver``: the workers' output is shown here (run option ``worker_logs``)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    on_main_thread = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if on_main_thread else None
    if os.environ.get("RAY_ADDRESS") and say is not None:
        say(f"RAY_ADDRESS={os.environ['RAY_ADDRESS']} is ignored: a golden run starts its own "
            "local Ray instance (no shared cluster, no other jobs' actors)")
    from harness.runner.ray_start import local_start

    with local_start(log_to_driver):
        ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False,
                 log_to_driver=log_to_driver, runtime_env=runtime_env,
                 _system_config=dict(FORKED_WORKERS_RAY_CONFIG) if os.environ.get(ZYGOTE_ENV, "1").strip() != "0"
                 else {"worker_maximum_startup_concurrency": STARTUP_CONCURRENCY})
    if sigterm is not None:  # ray.init replaces it with sys.exit(15); the caller's shutdown path wins
        signal.signal(signal.SIGTERM, sigterm)


class WarmRuntime:
    """One Ray instance and the idle warm processes of one driver process (module docstring)."""

    def __init__(self, *, worker_logs: bool = False) -> None:
        """``worker_logs``: its Ray shows the workers' output (run option ``worker_logs``:
        ``--golden-option worker_logs=true``; one Ray serves every workload of the session)."""
        self.worker_logs = worker_logs
        self._idle: dict[str, list] = {k: [] for k in KINDS}
        self._idle_dataplanes: list[tuple[Any, str]] = []  # (handle, its name), the last released first
        self._dataplane_seq = 0
        self._owns_ray = False
        self._reaper = None
        self._zygote = None  # harness.runner.zygote.Zygote while Ray is up (GOLDEN_ZYGOTE=0: none)
        self._tainted: dict[str, str] = {}  # actor id -> the setup hook the process ran
        self.started = 0   # warm processes started
        self.reused = 0    # acquisitions answered by an idle process
        self.ray_starts = 0
        self.hooks_undone = 0    # processes pooled again after their hook was undone
        self.tainted_killed = 0  # processes killed because an undo failed
        self.dataplanes_started = 0  # data-plane processes started
        self.dataplanes_reused = 0   # data-plane acquisitions answered by an idle one
        self._on_close: list[Callable[[], None]] = []  # run once by the next close()

    # -- Ray -------------------------------------------------------------------------------
    def ray_up(self) -> bool:
        """Whether this runtime's Ray instance is up."""
        import ray

        return self._owns_ray and ray.is_initialized()

    def ensure_ray(self, say: Callable[[str], None] | None = None) -> bool:
        """Start Ray unless this runtime's instance is up; True when it started it now."""
        global _current
        import ray

        with _lock:
            if self._owns_ray and ray.is_initialized():
                return False
            if ray.is_initialized():
                raise RuntimeError("a warm golden runtime needs this process's Ray, but another Ray instance is up")
            self._idle = {k: [] for k in KINDS}
            self._idle_dataplanes = []
            self._tainted = {}
            self._start_reaper()  # before ray.init: every process of this Ray inherits the token
            self._start_zygote()  # after the reaper (it carries the token); imports torch while Ray starts
            try:
                start_local_ray({"env_vars": dict(BASE_ENV)}, say, log_to_driver=self.worker_logs)
            except BaseException:
                if self._zygote is not None:
                    self._zygote.close()
                    self._zygote = None
                self._stop_reaper()
                raise
            self._owns_ray = True
            self.ray_starts += 1
            _current = self
            from harness.workerenv.select import set_warm_runtime_env  # standard library only

            set_warm_runtime_env(zygote_runtime_env)
            return True

    def prestart(self, policy: int = 1, rollout: int = 1, dataplane: bool = True) -> None:
        """Start Ray, the zygote and a first ``policy`` + ``rollout`` warm processes (and a
        data-plane process, and each rollout process's fork server of internal engine processes)
        now, idle in the pool, before any workload asks: the pytest plugin
        calls this on a thread of its own while pytest collects (``harness.pytest_prestart``),
        so the start-up that the first workload would wait for runs on the core collection
        leaves idle. The processes are the ones :meth:`acquire` would start (no setup hook runs
        in a pooled process until it is acquired), so nothing a workload sees depends on it."""
        importer = threading.Thread(target=_import_actor_modules, name="golden-prestart-imports", daemon=True)
        importer.start()  # torch and the actor classes' modules load while ray.init waits for Ray's processes
        self.ensure_ray()
        importer.join()
        with _lock:
            for kind, n in (("policy", policy), ("rollout", rollout)):
                if n > 0:
                    self._idle[kind].extend(self._spawn(kind, n))
            for host in self._idle["rollout"]:  # queued before any workload's adopt (actor call order)
                host.start_engine_server.remote()
        if dataplane and not self._idle_dataplanes:
            self._idle_dataplanes.append(self.acquire_dataplane())  # a new one: no idle data plane yet

    def start_flavours(self, names: list[str]) -> list[str]:
        """Have the zygote start these flavours now (``zygote.FLAVOURS``: a policy backend's
        start-up imports, megatron-core's about 1.5 s of CPU), instead of when the backend's first
        rank asks; returns those started. Waits for the zygote's preloads (call it off the
        critical path: the plugin does it on a thread once it knows the session's workloads)."""
        zygote = self._zygote
        if zygote is None:
            return []
        return [name for name in names if zygote.flavour(name) is not None]

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, when :meth:`close` next shuts this runtime down."""
        self._on_close.append(callback)

    def _start_zygote(self) -> None:
        """The fork server this runtime's workers start from (``harness.runner.zygote``); it
        imports torch while the caller goes on (its clients queue until it listens)."""
        if os.environ.get(ZYGOTE_ENV, "1").strip() == "0":
            return
        from harness.runner.zygote import Zygote

        self._zygote = Zygote({**os.environ, **BASE_ENV})  # after start_reaper: it carries the token

    def _start_reaper(self) -> None:
        """The runtime's reaper (``harness.runner.reaper``, as a cold ``Session`` has one): a
        driver that dies, even SIGKILLed, leaves no process of this Ray, pool included."""
        from harness.runner.reaper import start_reaper

        self._reaper = start_reaper("warm-")

    def _stop_reaper(self) -> None:
        from harness.runner.reaper import stop_reaper

        if self._reaper is not None:
            stop_reaper(self._reaper)
            self._reaper = None

    # -- the pool ----------------------------------------------------------------------------
    def _actor_class(self, kind: str):
        if kind == "policy":
            from harness.policy.worker import PolicyHost

            return PolicyHost
        if kind == "rollout":
            from harness.rollout.worker import rollout_worker_host_actor

            return rollout_worker_host_actor()
        raise ValueError(f"unknown warm process kind {kind!r} (expected one of {KINDS})")

    def _spawn(self, kind: str, n: int) -> list:
        cls = self._actor_class(kind)
        runtime_env = _pool_runtime_env()
        fresh = [cls.options(num_cpus=0, runtime_env=runtime_env).remote() for _ in range(n)]
        self.started += n
        return fresh

    def acquire(self, kind: str, n: int) -> list:
        """``n`` warm processes of ``kind``: idle ones first (the last released first), then new
        ones. The caller must ``adopt`` each and later ``release`` or ``discard`` it.
        With a ``harness.mutations.WARM_SAFE`` hook set (:func:`setup_hook`), each runs it first
        and is tainted until ``release`` has undone it."""
        import ray

        if not self._owns_ray:
            raise RuntimeError("WarmRuntime.acquire before ensure_ray")
        idle = self._idle[kind]
        taken, self._idle[kind] = idle[:n], idle[n:]
        self.reused += len(taken)
        handles = taken + self._spawn(kind, n - len(taken))
        hook = setup_hook()
        if hook is not None:
            if not hook_runs_warm(hook):  # the session chose a private Ray for such a run
                raise RuntimeError(f"{HOOK_VAR}={hook} cannot run in warm processes")
            self._tainted.update({_actor_id(h): hook for h in handles})
            ray.get([h.run_setup_hook.remote(hook) for h in handles])
        return handles

    def release(self, kind: str, handles: list) -> None:
        """Hand back processes whose workload retired them cleanly. A tainted one (it ran a
        setup hook) first undoes the hook; if that fails it is killed and a clean replacement
        starts now."""
        import ray

        if not self._owns_ray:
            self.discard(handles)
            return
        tainted = [h for h in handles if _actor_id(h) in self._tainted]
        back = [h for h in handles if _actor_id(h) not in self._tainted]
        if tainted:
            refs = [h.undo_setup_hook.remote(self._tainted.pop(_actor_id(h))) for h in tainted]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=30)
            for h, ref in zip(tainted, refs):
                try:
                    if ref not in ready:
                        raise TimeoutError("undo did not answer")
                    ray.get(ref)
                except Exception:  # noqa: BLE001 - any failure: the process is not reusable
                    self.discard([h])
                    self.tainted_killed += 1
                    back.extend(self._spawn(kind, 1))
                    continue
                self.hooks_undone += 1
                back.append(h)
        self._idle[kind][:0] = back  # the last released are acquired first

    def acquire_dataplane(self) -> tuple[Any, str]:
        """A data-plane actor (``harness.dataplane.actor.DataPlaneActor``) that serves no file:
        ``(handle, its name)``, an idle one first, else a new one (named once, for its life;
        the capture sinks find it by that name). The caller has it ``open`` the run's new file,
        and after ``close`` hands it back (:meth:`release_dataplane`) or kills it
        (:meth:`discard`). No setup hook runs in it: it holds no code a planted regression
        patches."""
        if not self._owns_ray:
            raise RuntimeError("WarmRuntime.acquire_dataplane before ensure_ray")
        if self._idle_dataplanes:
            self.dataplanes_reused += 1
            return self._idle_dataplanes.pop(0)
        from harness.dataplane.actor import DataPlaneActor

        self._dataplane_seq += 1
        name = f"golden-dataplane-{os.getpid()}-{self._dataplane_seq}"
        handle = DataPlaneActor.options(name=name, num_cpus=0,
                                        runtime_env=_pool_runtime_env()).remote()
        self.dataplanes_started += 1
        return handle, name

    def release_dataplane(self, handle: Any, name: str) -> None:
        """Hand back a data-plane actor whose file its workload closed without an error."""
        if not self._owns_ray:
            self.discard([handle])
            return
        self._idle_dataplanes.insert(0, (handle, name))

    @staticmethod
    def discard(handles: list) -> None:
        import ray

        for h in handles:
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001 - best-effort: the actor may already be gone
                pass

    def idle(self) -> dict[str, int]:
        return {k: len(v) for k, v in self._idle.items()}

    def stats(self) -> dict[str, Any]:
        return {"ray_starts": self.ray_starts, "started": self.started, "reused": self.reused,
                "hooks_undone": self.hooks_undone, "tainted_killed": self.tainted_killed, "idle": self.idle(),
                "dataplanes_started": self.dataplanes_started, "dataplanes_reused": self.dataplanes_reused,
                "zygote": self._zygote is not None and self._zygote.alive()}

    # -- teardown ----------------------------------------------------------------------------
    def close(self) -> None:
        """Kill the idle processes and shut down this runtime's Ray; idempotent. The runtime
        can be used again (it starts a new instance)."""
        global _current
        import ray

        with _lock:
            for kind in KINDS:
                handles, self._idle[kind] = self._idle[kind], []
                self.discard(handles)
            dataplanes, self._idle_dataplanes = self._idle_dataplanes, []
            self.discard([h for h, _ in dataplanes])
            self._tainted = {}
            if self._owns_ray and ray.is_initialized():
                ray.shutdown()
            self._owns_ray = False
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None
            self._stop_reaper()
            callbacks, self._on_close = self._on_close, []
            for callback in callbacks:
                callback()
            if _current is self:
                _current = None
                from harness.workerenv.select import set_warm_runtime_env

                set_warm_runtime_env(None)


def _import_actor_modules() -> None:
    """Import the modules of the pool's actor classes (torch with them); errors are left to the
    spawn that needs them."""
    import importlib

    for name in ("harness.policy.worker", "harness.rollout.worker", "harness.dataplane.actor"):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - WarmRuntime._spawn raises it where it matters
            pass


def _actor_id(handle) -> str:
    return handle._ray_actor_id.hex()
