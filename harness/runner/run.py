"""``golden run``: execute one workload and leave a complete run directory.

Contract:
* the run directory is created fresh; ``run.json`` is written first with
  status ``running`` and the list of expected artifacts, and rewritten at the
  end with ``completed`` or ``failed`` (plus the error);
* Ray, every policy and rollout worker, internal engine processes and the
  data plane are shut down on every exit path (error, Ctrl-C): no orphans;
* a worker that dies mid-step ends the run with an error naming it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import code_identity
from harness.artifacts import layout
from harness.portable import pins
from harness.postflight.placement import PLACEMENT_FILE
from harness.runner.environment import collect_environment, git_commit
from harness.spec.runplan import RunOptions, RunPlan, write_plan
from harness.spec.typed import Workload, as_workload


@dataclass
class RunOutcome:
    run_dir: Path
    status: str                 # completed | failed
    error: str | None
    wall_s: float


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)


def expected_artifacts(spec: Workload, topology, *, placed: bool = False) -> list[str]:
    """Files a complete run must contain: a trace per profiler instance, the metrics, the
    rollout summaries (capture on) and, for a run placed from the plan (``placed``: every
    cold run), ``placement.json`` (``harness.runner.placement``). ``spec``: the plan's workload."""
    paths = []
    if spec.plugins.policy_profiler:
        paths += [layout.policy_trace_path(r) for r in range(topology.policy.world)]
        if topology.teacher is not None:  # the teacher's ranks run the policy profiler too
            paths += [layout.trace_path("teacher", r) for r in range(topology.teacher.world)]
    if spec.plugins.rollout_profiler:
        paths += [layout.rollout_trace_path(r) for r in range(topology.rollout.world)]
    paths.append(layout.METRICS)
    if spec.capture.enabled:
        paths.append(layout.ROLLOUTS)
    if placed:
        paths.append(PLACEMENT_FILE)
    return paths


def worker_env(spec: Workload, run_dir: Path, run_id: str, options: RunOptions | None = None) -> dict[str, str]:
    """Environment every worker process gets (the plugin contract is env-only); ``spec``: the
    plan's workload; ``options``: its run options, whose switches a worker reads cross here
    (``RunOptions.worker_env``: each one set, so the driver's own environment never decides)."""
    plugins = spec.plugins
    env = {
        **plugins.env,  # the schema reserves the keys set below
        **(options or RunOptions()).worker_env(),
        "HARNESS_TRACE_DIR": str(run_dir),
        "HARNESS_RUN_ID": run_id,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "RAY_AUTH_MODE": "disabled",
        **code_identity.exported(),  # every process checks it runs the driver's harness (code_identity)
    }
    if pins.pinned_by_harness():  # a pinned driver's workers run pinned, on any node of a cluster too
        env.update(pins.PINS)
        env[pins.MARK_VAR] = "1"
    if plugins.policy_profiler:
        env["NRL_POLICY_PROFILER_CLASS"] = plugins.policy_profiler
    if plugins.rollout_profiler:
        env["NRL_ROLLOUT_PROFILER_CLASS"] = plugins.rollout_profiler
    return env


def run_workload(spec: dict, run_dir: Path, *, progress: Callable[[str], None] | None = None,
                 warm=None, ray_address: str | None = None) -> RunOutcome:
    """Run ``spec`` (a loaded spec, or a dict :func:`~harness.spec.typed.as_workload` completes)
    into ``run_dir``: :func:`run_planned` of its plan (``harness.spec.runplan.plan_of``: the layout
    checked, laid out once; ``ray_address``: join that Ray cluster)."""
    from harness.spec.runplan import plan_of

    return run_planned(plan_of(as_workload(spec), ray_address=ray_address), run_dir, progress=progress, warm=warm)


def run_planned(run_plan: RunPlan, run_dir: Path, *, progress: Callable[[str], None] | None = None,
                warm=None) -> RunOutcome:
    """Run ``run_plan`` (``harness.spec.runplan``: built and checked once, before this) into
    ``run_dir`` (must not exist or be empty). ``warm``: a ``harness.runner.warm.WarmRuntime``
    whose Ray and warm processes the run reuses (the pytest plugin's); None: a private Ray
    instance, started and torn down. The plan's ``ray_address``: join that Ray cluster instead
    (``warm`` is then not used; check it first with ``harness.runner.cluster.preflight``).
    Nothing here loads, plans or checks the spec again."""
    run_dir = Path(run_dir).absolute()  # workers may start in another directory (ray_start.driver_harness_first)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise FileExistsError(f"run directory {run_dir} is not empty")
    run_dir.mkdir(parents=True, exist_ok=True)
    spec, ray_address = run_plan.workload, run_plan.ray_address
    run_id = f"{spec.name}-{uuid.uuid4().hex[:8]}"
    if ray_address is not None:
        if warm is not None and progress is not None:
            from harness.runner.capacity import WARM_ON_CLUSTER

            progress(f"cold start on the Ray cluster at {ray_address}: {WARM_ON_CLUSTER}")
        warm = None
    placed = warm is None or _private_ray(spec)
    return _execute(run_plan, run_dir, run_id, _new_run_doc(run_plan, run_id, placed=placed), None,
                    progress, warm=warm)


def _private_ray(spec) -> bool:
    """A warm runtime still runs this spec in a Ray of its own (so it is placed)."""
    from harness.runner.warm import private_ray_reason

    return private_ray_reason(spec) is not None


def resume_workload(run_dir: Path, *, progress: Callable[[str], None] | None = None,
                    ray_address: str | None = None, run_plan: RunPlan | None = None) -> RunOutcome:
    """Continue a stopped run from its newest checkpoint (``golden run --resume``).

    ``run_plan``: the plan the run stored (``harness.spec.runplan.read_plan`` of its run.json;
    None: read here, with ``ray_address``). Its ``ray_address``: resume on that Ray cluster
    (fresh actors placed from the plan, as in the first segment; the run directory must be
    one every node sees); None: a private local instance (check the cluster first with
    ``cluster.preflight``).

    The spec is the one in the run's ``run.json`` (no overrides); logs are cut
    back to the checkpoint, the data plane and ledger restored from it, and the
    profilers write a new trace segment that postflight merges at the
    checkpoint boundary.
    """
    from harness.runner import checkpoint
    from harness.spec.runplan import read_plan

    run_dir = Path(run_dir).absolute()
    run_doc = json.loads((run_dir / layout.RUN_JSON).read_text())
    found = checkpoint.latest(run_dir)
    if found is None:
        raise FileNotFoundError(f"{run_dir}: no checkpoint to resume from (set grpo.checkpoint_every)")
    ckpt, state = found
    if run_plan is None:
        run_plan = read_plan(run_doc, source=str(run_dir / layout.RUN_JSON), ray_address=ray_address)
    checkpoint.rewind_logs(run_dir, state)
    checkpoint.restore_stores(run_dir, ckpt)
    segment = int(run_doc.get("segments", 1))
    run_doc.update(status="running", error=None, segments=segment + 1,
                   resumed=[*run_doc.get("resumed", []), {"segment": segment, "after_step": state["step"]}])
    resume = (ckpt, state)
    return _execute(run_plan, run_dir, run_doc["run_id"], run_doc, resume, progress,
                    trace_env={"HARNESS_TRACE_SEGMENT": str(segment), "HARNESS_STEP_OFFSET": str(state["step"])})


def _new_run_doc(run_plan: RunPlan, run_id: str, *, placed: bool = False) -> dict:
    spec = run_plan.workload
    doc = {"run_id": run_id}
    write_plan(doc, run_plan)  # workload, spec, spec_digest, topology, plan_options
    doc.update({
        "environment": collect_environment(spec),
        "git_commit": git_commit(),
        "code": {"digest": code_identity.digest(), "root": str(code_identity.package_root())},
        "status": "running",
        "error": None,
        "expected_artifacts": expected_artifacts(spec, run_plan.topology, placed=placed),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    return doc


def _execute(run_plan: RunPlan, run_dir: Path, run_id: str, run_doc: dict, resume,
             progress: Callable[[str], None] | None, trace_env: dict[str, str] | None = None,
             warm=None) -> RunOutcome:
    spec = run_plan.workload
    say = progress or (lambda msg: None)
    _write_json(run_dir / layout.RUN_JSON, run_doc)
    t0 = time.perf_counter()
    error = None
    env = {**worker_env(spec, run_dir, run_id, run_plan.options), **(trace_env or {})}
    previous = _terminate_as_interrupt()
    try:
        from harness.progress import phase

        phase(say, "loading torch and ray")
        from harness.runner.process_state import freeze_driver_heap
        from harness.runner.session import Session  # torch + ray live behind this import

        freeze_driver_heap()

        with Session(run_plan, run_dir, env, say, resume=resume, warm=warm) as session:
            session.run_iterations()
    except KeyboardInterrupt:
        error = "interrupted (Ctrl-C or SIGTERM)"
    except BaseException as exc:  # noqa: BLE001 - recorded, then reported by the caller
        error = f"{type(exc).__name__}: {exc}"
        say(traceback.format_exc())
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    wall = time.perf_counter() - t0
    run_doc.update(
        status="failed" if error else "completed",
        error=error,
        wall_s=round(wall, 3),
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    _write_json(run_dir / layout.RUN_JSON, run_doc)
    return RunOutcome(run_dir, run_doc["status"], error, wall)


def _terminate_as_interrupt():
    """SIGTERM (a CI timeout, ``kill``) shuts down like Ctrl-C: workers torn down,
    run.json marked failed. Returns the previous handler (None off the main thread)."""
    def handler(signum, frame):
        from harness import interrupts

        interrupts.note(signum)  # the exit code names the signal (143)
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return None


def default_progress(msg: str) -> None:
    print(f"[golden] {msg}", file=sys.stderr, flush=True)
