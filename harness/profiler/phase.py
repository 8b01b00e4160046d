"""One profiled phase: operator inventory, collectives and memory of a window.

A :class:`PhaseProbe` is started at a phase's begin and stopped at its end,
on the same thread. It combines ``torch.profiler`` (CPU activity; op name ->
call count), the :class:`CollectiveRecorder` and memory counters. Only one
``torch.profiler`` session can run in a process: a probe that cannot start
one reports ``operators=None`` and says why in ``problems`` rather than
failing the step it observes.
"""

from __future__ import annotations

import os
import re
import resource
import threading
import time
from typing import Any

import torch
import torch.profiler as tprof

from harness.profiler.collectives import CollectiveRecorder

# names produced by our own instrumentation, not by the observed code
_INSTRUMENTATION_OPS = frozenset({"PythonDispatchMode"})
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")

_torch_profiler_owner: PhaseProbe | None = None
_owner_lock = threading.Lock()


def stable_op_name(name: str) -> str:
    """Op name without addresses, so inventories compare across runs."""
    return _ADDRESS.sub("0x?", name)


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

    def __init__(self) -> None:
        self._profiler: tprof.profile | None = None
        self._recorder = CollectiveRecorder()
        self._problems: list[str] = []
        self._t0 = 0.0
        self._rss0 = 0

    def start(self) -> None:
        global _torch_profiler_owner
        self._t0 = time.perf_counter()
        self._rss0 = _rss_bytes()
        if _cuda_in_use():
            torch.cuda.reset_peak_memory_stats()
        with _owner_lock:
            if _torch_profiler_owner is None:
                profiler = tprof.profile(activities=[tprof.ProfilerActivity.CPU], record_shapes=False)
                try:
                    profiler.start()
                except Exception as exc:  # another tool's profiler session is active
                    self._problems.append(f"torch.profiler could not start: {exc!r}")
                else:
                    self._profiler = profiler
                    _torch_profiler_owner = self
            else:
                self._problems.append("torch.profiler already in use by another phase in this process")
        self._recorder.start()

    def stop(self) -> dict[str, Any]:
        """Stop observing; ``{operators, collectives, memory, wall_s[, problems]}``."""
        global _torch_profiler_owner
        try:
            collectives = self._recorder.stop()
        except RuntimeError as exc:
            collectives = list(self._recorder.entries)
            self._problems.append(str(exc))
        operators: dict[str, int] | None = None
        if self._profiler is not None:
            try:
                self._profiler.stop()
                counts: dict[str, int] = {}
                for event in self._profiler.key_averages():
                    name = stable_op_name(event.key)
                    if name in _INSTRUMENTATION_OPS:
                        continue
                    counts[name] = counts.get(name, 0) + int(event.count)
                operators = dict(sorted(counts.items()))
            finally:
                with _owner_lock:
                    if _torch_profiler_owner is self:
                        _torch_profiler_owner = None
                self._profiler = None
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
