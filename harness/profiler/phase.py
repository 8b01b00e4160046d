"""One profiled phase: operator inventory, collectives and memory of a window.

A :class:`PhaseProbe` is started at a phase's begin and stopped at its end,
on the same thread. It combines an operator source (op name -> call count),
a collective recorder (harness.profiler.collectives) and memory counters.

Operator sources (``HARNESS_TRACE_OPERATORS``, resolved once per profiler by
:func:`resolve_probe_config`):

* ``recordfn`` (default): RecordFunction entries counted in C++
  (harness.profiler.opcount); ~1.2x on the smoke workload's generation.
* ``profiler``: ``torch.profiler`` (CPU activity), its raw events counted in
  one pass (no ``key_averages()``, whose tree building and de-duplication of
  nested same-name events cost ~10 s per smoke step). Observes the same
  RecordFunction stream, so it yields the same inventory as ``recordfn``,
  at ~10x on the smoke workload's generation. Also the automatic fallback
  when the C++ counter cannot be built (no compiler).
* ``off``: no operator inventory (``operators: null``).

Which phases get an inventory (``HARNESS_TRACE_OPERATOR_STEPS``, a
:class:`StepSchedule`): every phase by default; otherwise only the steps the
schedule names (``1``, ``1,5``, ``2-4``, ``every:10`` = steps 1, 11, 21, ...;
items combine). Counting costs one RecordFunction per op, which a
launch-bound GPU step pays on its critical path (docs/plugins.md section 5);
a schedule bounds that cost the way ``torch.profiler.schedule`` does. Phases
outside it record ``operators: null`` and ``operators_skipped`` (the
schedule); phases with no step number (``engine_init``) are always counted.

Both counting sources drop the same utility names (opcount.IGNORED_NAMES).
Only one ``torch.profiler`` session can run in a process: a ``profiler``-source
probe that cannot start one reports ``operators=None`` and says why in
``problems`` rather than failing the step it observes (``recordfn`` allows
up to opcount.MAX_SESSIONS concurrent windows).
"""

from __future__ import annotations

import os
import re
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.profiler as tprof

from harness.profiler import collectives as _collectives
from harness.profiler import opcount

OPERATORS_ENV = "HARNESS_TRACE_OPERATORS"
OPERATOR_STEPS_ENV = "HARNESS_TRACE_OPERATOR_STEPS"
OPERATOR_SOURCES = ("recordfn", "profiler", "off")
DEFAULT_OPERATOR_SOURCE = "recordfn"

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")

_torch_profiler_owner: PhaseProbe | None = None
_owner_lock = threading.Lock()


@dataclass(frozen=True)
class StepSchedule:
    """The steps whose phases get an operator inventory (``HARNESS_TRACE_OPERATOR_STEPS``).

    ``spec`` is the text as given; ``steps`` the explicit 1-based steps;
    ``every`` > 0 adds steps 1, 1 + every, 1 + 2 * every, ...
    """

    spec: str
    steps: frozenset[int] = frozenset()
    every: int = 0

    def selects(self, step: int | None) -> bool:
        """Whether a phase of ``step`` is counted; a phase with no step always is."""
        if step is None:
            return True
        return step in self.steps or (self.every > 0 and step >= 1 and (step - 1) % self.every == 0)


def parse_step_schedule(raw: str) -> StepSchedule | None:
    """``None`` for every step (unset, empty, ``all``); ``ValueError`` naming the variable otherwise."""
    text = raw.strip().lower()
    if text in ("", "all"):
        return None
    steps: set[int] = set()
    every = 0

    def bad(item: str, why: str) -> ValueError:
        return ValueError(f"{OPERATOR_STEPS_ENV}={raw!r}: item {item!r} {why} "
                          "(expected 'all' or a comma list of N, A-B, every:N; steps count from 1)")

    for item in (part.strip() for part in text.split(",")):
        try:
            if item.startswith("every:"):
                if every:
                    raise bad(item, "repeats every:")
                every = int(item[len("every:"):])
                if every < 1:
                    raise bad(item, "must be >= 1")
            elif "-" in item:
                lo, hi = (int(x) for x in item.split("-", 1))
                if not 1 <= lo <= hi:
                    raise bad(item, "is not a range A-B with 1 <= A <= B")
                steps.update(range(lo, hi + 1))
            else:
                step = int(item)
                if step < 1:
                    raise bad(item, "must be >= 1")
                steps.add(step)
        except ValueError as exc:
            if str(exc).startswith(OPERATOR_STEPS_ENV):
                raise
            raise bad(item, "is not a number") from None
    return StepSchedule(spec=raw.strip(), steps=frozenset(steps), every=every)


@dataclass(frozen=True)
class ProbeConfig:
    """How phases are observed: operator source, collective method, and why, if not as asked."""

    operators: str = DEFAULT_OPERATOR_SOURCE
    collectives: str = "kernel"
    notes: tuple[str, ...] = field(default=())
    operator_steps: StepSchedule | None = None  # None: every phase

    def header_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"operator_source": self.operators, "collective_method": self.collectives}
        if self.operator_steps is not None:
            fields["operator_steps"] = self.operator_steps.spec
        if self.notes:
            fields["probe_notes"] = list(self.notes)
        return fields


def settings_problems(environ: dict[str, str]) -> list[str]:
    """What would fail a trace profiler at start in ``environ`` (its HARNESS_TRACE_* values), without
    building the operator counter or installing the collective kernels; ``[]`` when all parse."""
    problems = []
    source = environ.get(OPERATORS_ENV, "").strip().lower()
    if source and source not in OPERATOR_SOURCES:
        problems.append(f"{OPERATORS_ENV}={source!r}: expected one of {', '.join(OPERATOR_SOURCES)}")
    try:
        parse_step_schedule(environ.get(OPERATOR_STEPS_ENV, ""))
    except ValueError as exc:
        problems.append(str(exc))
    method = environ.get(_collectives.METHOD_ENV, "").strip().lower()
    if method and method not in _collectives.METHODS:
        problems.append(f"{_collectives.METHOD_ENV}={method!r}: expected one of {', '.join(_collectives.METHODS)}")
    return problems


def resolve_probe_config(environ: dict[str, str] | None = None) -> ProbeConfig:
    """Read ``HARNESS_TRACE_OPERATORS`` / ``_OPERATOR_STEPS`` / ``_COLLECTIVES``; builds the C++ counter if needed.

    ``ValueError`` for an unknown value. ``recordfn`` falls back to
    ``profiler`` (same inventory) with a note when the counter is unavailable.
    """
    env = os.environ if environ is None else environ
    requested = env.get(OPERATORS_ENV, "").strip().lower() or DEFAULT_OPERATOR_SOURCE
    if requested not in OPERATOR_SOURCES:
        raise ValueError(f"{OPERATORS_ENV}={requested!r}: expected one of {', '.join(OPERATOR_SOURCES)}")
    schedule = parse_step_schedule(env.get(OPERATOR_STEPS_ENV, ""))
    notes: list[str] = []
    source = requested
    if requested == "recordfn":
        try:
            opcount.load()
        except opcount.OpCountUnavailable as exc:
            source = "profiler"
            notes.append(f"operator source recordfn unavailable, using profiler (same inventory, slower): {exc}")
    method = _collectives.resolve_method(env)
    if method == "kernel":
        _collectives.install_kernels()  # once per process, before any phase (not in its wall time)
    if method == "mode" and env.get(_collectives.METHOD_ENV, "").strip().lower() != "mode":
        notes.append("kernel method unavailable in this torch: collectives recorded with a dispatch mode (slow)")
    return ProbeConfig(operators=source, collectives=method, notes=tuple(notes),
                       operator_steps=None if source == "off" else schedule)


def stable_op_name(name: str) -> str:
    """Op name without addresses, so inventories compare across runs."""
    return _ADDRESS.sub("0x?", name)


def _normalise(raw: dict[str, int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, n in raw.items():
        if name in opcount.IGNORED_NAMES:
            continue
        key = stable_op_name(name)
        counts[key] = counts.get(key, 0) + n
    return dict(sorted(counts.items()))


def _profiler_counts(profiler: tprof.profile) -> dict[str, int]:
    """Raw CPU events of a stopped ``torch.profiler`` session, counted by name in one pass."""
    results = getattr(profiler.profiler, "kineto_results", None)
    if results is None:
        raise RuntimeError("torch.profiler returned no results")
    cpu = torch.autograd.DeviceType.CPU
    raw: dict[str, int] = {}
    for event in results.events():
        if event.device_type() != cpu:
            continue
        hidden = getattr(event, "is_hidden_event", None)
        if hidden is not None and hidden():
            continue
        name = event.name()
        raw[name] = raw.get(name, 0) + 1
    return _normalise(raw)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class PhaseProbe:
    """Observes one phase; ``stop()`` returns the fields of its ``phase`` record."""

    def __init__(self, config: ProbeConfig | None = None) -> None:
        self.config = config if config is not None else resolve_probe_config()
        self._profiler: tprof.profile | None = None
        self._counter: opcount.RecordFunctionCounter | None = None
        self._recorder = _collectives.CollectiveRecorder(self.config.collectives)
        self._problems: list[str] = []
        self._t0 = 0.0
        self._rss0 = 0

    def _start_profiler(self) -> None:
        global _torch_profiler_owner
        with _owner_lock:
            if _torch_profiler_owner is None:
                profiler = tprof.profile(
                    activities=[tprof.ProfilerActivity.CPU], record_shapes=False, profile_memory=False,
                    with_stack=False, with_flops=False, with_modules=False,
                )
                try:
                    profiler.start()
                except Exception as exc:  # noqa: BLE001 - another tool's profiler session is active
                    self._problems.append(f"torch.profiler could not start: {exc!r}")
                else:
                    self._profiler = profiler
                    _torch_profiler_owner = self
            else:
                self._problems.append("torch.profiler already in use by another phase in this process")

    def _stop_profiler(self) -> dict[str, int] | None:
        global _torch_profiler_owner
        if self._profiler is None:
            return None
        try:
            self._profiler.stop()
            return _profiler_counts(self._profiler)
        finally:
            with _owner_lock:
                if _torch_profiler_owner is self:
                    _torch_profiler_owner = None
            self._profiler = None

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._rss0 = _rss_bytes()
        if _cuda_in_use():
            torch.cuda.reset_peak_memory_stats()
        self._recorder.start()
        source = self.config.operators
        if source == "recordfn":
            try:
                counter = opcount.RecordFunctionCounter()
                counter.start()
            except (opcount.OpCountUnavailable, opcount.OpCountBusy) as exc:
                self._problems.append(f"operator counter could not start: {exc}")
            else:
                self._counter = counter
        elif source == "profiler":
            self._start_profiler()

    def stop(self) -> dict[str, Any]:
        """Stop observing; ``{operators, collectives, memory, wall_s[, problems]}``."""
        operators: dict[str, int] | None = None
        if self._counter is not None:
            counter, self._counter = self._counter, None
            raw, problem = counter.stop()
            operators = _normalise(raw)
            if problem:
                self._problems.append(problem)
        elif self._profiler is not None:
            operators = self._stop_profiler()
        try:
            collectives = self._recorder.stop()
        except RuntimeError as exc:
            collectives = list(self._recorder.entries)
            self._problems.append(str(exc))
        rss_end = _rss_bytes()
        memory = {"rss_begin": self._rss0, "rss_end": rss_end, "peak_rss": max(_peak_rss_bytes(), rss_end)}
        if _cuda_in_use():
            memory["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated())
        fields: dict[str, Any] = {
            "operators": operators,
            "collectives": collectives,
            "memory": memory,
            "wall_s": round(time.perf_counter() - self._t0, 6),
        }
        if self._problems:
            fields["problems"] = list(self._problems)
        return fields
