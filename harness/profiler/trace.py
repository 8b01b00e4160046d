"""Built-in trace profilers: per-rank trace artifacts for the gate's surfaces.

``TracePolicyProfiler`` and ``TraceRolloutProfiler`` implement the plugin
contracts (harness.plugins.protocols) and are loaded like any third-party
plugin, by class path. They are configured only through the environment:

* ``HARNESS_TRACE_DIR`` (required): the run directory, or its ``artifacts/``;
* ``HARNESS_RUN_ID`` (optional): copied into the header;
* ``HARNESS_TRACE_OPERATORS`` (optional): operator source, ``recordfn``
  (default), ``profiler`` or ``off`` (harness.profiler.phase);
* ``HARNESS_TRACE_OPERATOR_STEPS`` (optional): which steps' phases get an
  operator inventory, ``all`` (default) or e.g. ``1,5`` / ``every:10``
  (harness.profiler.phase.StepSchedule);
* ``HARNESS_TRACE_COLLECTIVES`` (optional): ``kernel`` (default) or ``mode``
  (harness.profiler.collectives);
* ``HARNESS_TRACE_SEGMENT`` / ``HARNESS_STEP_OFFSET`` (set by ``golden run
  --resume``): write segment N of the trace (``rank{R:05d}.segN.trace.jsonl``)
  whose header carries ``resume_step``, and number policy steps from the
  offset, so postflight can merge the segments (harness.artifacts.segments).

The sources are resolved (and the C++ operator counter built, if needed) in
the constructor, before any phase; the header records them
(``operator_source``, ``collective_method``, ``probe_notes``).

Each instance owns one file, ``artifacts/{policy|rollout}/rank{R:05d}.trace.jsonl``
(harness.artifacts.layout), written through harness.artifacts.trace:
a header, one ``event`` per contract call, one ``phase`` record per closed
phase (policy ``train/step{N}``; rollout ``engine_init`` and
``rollout/{step_id}``), fsync at every phase end, and a ``close`` record.
A phase's begin and end must run on the same thread.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import torch

import harness
from harness.artifacts.layout import ARTIFACTS_DIR, trace_path
from harness.artifacts.trace import TraceWriter
from harness.profiler.phase import PhaseProbe, resolve_probe_config

TRACE_DIR_ENV = "HARNESS_TRACE_DIR"
RUN_ID_ENV = "HARNESS_RUN_ID"
SEGMENT_ENV = "HARNESS_TRACE_SEGMENT"
ROLE_ENV = "HARNESS_TRACE_ROLE"  # "teacher" in a distillation teacher's workers (default "policy")
POLICY_PROFILER_ROLES = {"policy": "train", "teacher": "teacher"}  # role -> phase prefix
STEP_OFFSET_ENV = "HARNESS_STEP_OFFSET"

_ROLLOUT_STEP = re.compile(r"step(\d+)(?:/|$)")


def rollout_step_number(step_id: int | str) -> int | None:
    """The GRPO step of a rollout window id (``3`` or ``"step3/attempt1"``); None if it names none."""
    if isinstance(step_id, int):
        return step_id
    match = _ROLLOUT_STEP.match(str(step_id))
    return int(match.group(1)) if match else None


def _env_int(name: str, environ) -> int:
    raw = environ.get(name, "") or "0"
    try:
        value = int(raw)
    except ValueError:
        raise RuntimeError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise RuntimeError(f"{name}={raw!r} must be >= 0")
    return value


def trace_file_for(role: str, rank: int, environ: dict[str, str] | None = None) -> Path:
    """Absolute trace path for ``role``/``rank`` from ``HARNESS_TRACE_DIR``."""
    env = os.environ if environ is None else environ
    raw = env.get(TRACE_DIR_ENV, "")
    if not raw:
        raise RuntimeError(f"{TRACE_DIR_ENV} is not set; the trace profilers need the run directory in it")
    root = Path(raw)
    run_dir = root.parent if root.name == ARTIFACTS_DIR else root
    return run_dir / trace_path(role, rank, _env_int(SEGMENT_ENV, env))


class _TraceProfiler:
    """Shared machinery: one writer, at most one open phase, idempotent close."""

    role = ""

    def __init__(self, *, rank: int) -> None:
        self.rank = rank
        self.segment = _env_int(SEGMENT_ENV, os.environ)
        self.step_offset = _env_int(STEP_OFFSET_ENV, os.environ)
        self.path = trace_file_for(self.role, rank)
        self._probe_config = resolve_probe_config()
        cls = type(self)
        self._writer = TraceWriter(
            self.path,
            {
                "role": self.role,
                "rank": rank,
                "run_id": os.environ.get(RUN_ID_ENV, ""),
                "pid": os.getpid(),
                "profiler": f"{cls.__module__}.{cls.__qualname__}",
                "harness_version": harness.__version__,
                "torch_version": torch.__version__,
                **self._probe_config.header_fields(),
                **({"segment": self.segment, "resume_step": self.step_offset} if self.segment else {}),
            },
        )
        self._phase: str | None = None
        self._probe: PhaseProbe | None = None
        self._skipped_by: str | None = None
        self._closed = False

    def _event(self, event: str, phase: str | None, **fields: Any) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} rank {self.rank} is closed ({event})")
        self._writer.write({"type": "event", "event": event, "phase": phase, **fields})

    def _begin_phase(self, phase: str, step: int | None = None) -> None:
        """Open ``phase``; its operators are counted unless the step schedule leaves ``step`` out."""
        if self._phase is not None:
            raise RuntimeError(f"{type(self).__name__} rank {self.rank}: phase {self._phase!r} is still open")
        config, self._skipped_by = self._probe_config, None
        schedule = config.operator_steps
        if schedule is not None and not schedule.selects(step):
            config, self._skipped_by = dataclasses.replace(config, operators="off"), schedule.spec
        self._phase = phase
        self._probe = PhaseProbe(config)
        self._probe.start()

    def _end_phase(self, outcome: str, **fields: Any) -> None:
        if self._phase is None or self._probe is None:
            return
        phase, probe = self._phase, self._probe
        self._phase, self._probe = None, None
        observed = probe.stop()
        if self._skipped_by is not None:
            observed["operators_skipped"] = self._skipped_by
        self._writer.write({"type": "phase", "phase": phase, "outcome": outcome, **fields, **observed})
        self._writer.flush(fsync=True)

    def close(self) -> None:
        """Abort a phase left open (reason ``profiler_closed``), write ``close``, close the file."""
        if self._closed:
            return
        try:
            if self._phase is not None:
                self._event("close", self._phase)
                self._end_phase("aborted", reason="profiler_closed")
            self._writer.write({"type": "close"})
        finally:
            self._closed = True
            self._writer.close()


class TracePolicyProfiler(_TraceProfiler):
    """Policy-profiler plugin writing ``artifacts/policy/rank{R:05d}.trace.jsonl``.

    In a distillation teacher's workers (``HARNESS_TRACE_ROLE=teacher``) it writes
    ``artifacts/teacher/rank{R:05d}.trace.jsonl`` instead, one phase ``teacher/step{N}``
    per teacher logits pass (harness.distill.teacher)."""

    role = "policy"

    def __init__(self, *, rank: int) -> None:
        role = os.environ.get(ROLE_ENV) or "policy"
        if role not in POLICY_PROFILER_ROLES:
            raise RuntimeError(f"{ROLE_ENV}={role!r}: expected one of {sorted(POLICY_PROFILER_ROLES)}")
        self.role = role
        super().__init__(rank=rank)
        self._steps_begun = self.step_offset

    def begin_train_step(self) -> None:
        self._steps_begun += 1
        phase = f"{POLICY_PROFILER_ROLES[self.role]}/step{self._steps_begun}"
        self._event("begin_train_step", phase)
        self._begin_phase(phase, self._steps_begun)

    def finish_train_step(self) -> None:
        self._event("finish_train_step", self._phase)
        self._end_phase("finished")

    def abort_train_step(self, *, reason: str) -> None:
        self._event("abort_train_step", self._phase, reason=reason)
        self._end_phase("aborted", reason=reason)


class _InitToken:
    """Opaque engine-initialisation token; identity is checked at ``end``."""

    __slots__ = ("rank",)

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __repr__(self) -> str:
        return f"<engine-init token rank={self.rank}>"


class TraceRolloutProfiler(_TraceProfiler):
    """Rollout-profiler plugin writing ``artifacts/rollout/rank{R:05d}.trace.jsonl``."""

    role = "rollout"

    def __init__(self, *, rank: int) -> None:
        super().__init__(rank=rank)
        self._token: _InitToken | None = None

    def begin_engine_initialization(self) -> object:
        self._event("begin_engine_initialization", "engine_init")
        self._begin_phase("engine_init")
        self._token = _InitToken(self.rank)
        return self._token

    def end_engine_initialization(self, token: object) -> None:
        if self._token is None or token is not self._token:
            raise ValueError(f"end_engine_initialization got {token!r}, not the token begin returned")
        self._token = None
        self._event("end_engine_initialization", "engine_init")
        self._end_phase("finished")

    def begin_rollout(self, *, step_id: int | str) -> None:
        phase = f"rollout/{step_id}"
        self._event("begin_rollout", phase, step_id=step_id)
        self._begin_phase(phase, rollout_step_number(step_id))

    def finish_rollout(self) -> None:
        self._event("finish_rollout", self._phase)
        self._end_phase("finished")

    def abort_rollout(self, *, reason: str) -> None:
        self._event("abort_rollout", self._phase, reason=reason)
        self._end_phase("aborted", reason=reason)
