"""What a reused worker process must look like before each workload: the state a cold one starts with.

A warm pool (``harness.runner.warm``) hands the same Ray worker processes to
consecutive workloads. ``ProcessBaseline.capture()`` runs once, when such a
process starts (torch already imported, nothing of any workload run yet);
``restore(env_vars)`` runs before every workload adopts the process and puts
back what a workload can change process-wide:

* the environment (``os.environ`` = the start-up one + the workload's
  ``env_vars``: ``HARNESS_TRACE_DIR``, ``HARNESS_RUN_ID``,
  ``NRL_*_PROFILER_CLASS``, ``RANK``, ... of the previous workload are gone),
  and the working directory;
* torch's global CPU RNG state, Python's ``random`` and numpy's global RNG
  (the workload seeds them again from (seed, rank); a draw before that sees
  what a fresh process sees);
* torch's intra- and inter-op thread counts, deterministic-algorithms mode
  (and its warn-only flag), grad mode, default dtype and float32 matmul
  precision.

It does not undo monkeypatches of modules by itself: a process that ran a
worker setup hook (:func:`run_setup_hook`, the planted regressions of
``harness.mutations.WARM_SAFE``) is pooled again only after
:func:`undo_setup_hook` put back every attribute the hook replaced (else it is
killed).
Module-level caches that stay are the idempotent, workload-independent ones
(``harness.parallel.settle``'s install, the operator counter's compiled
library, the collective recorder's dispatcher kernels, which record only
while a recorder is active). ``suites/golden/test_cold_warm_isolation.py`` proves
the result: warm and cold runs give byte-identical gated surfaces.

Standard library at import; torch is imported by ``capture``.
"""

from __future__ import annotations

import importlib
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any


def process_start_time(pid: int | None = None) -> float | None:
    """Wall-clock start of process ``pid`` (default: this one) from ``/proc``; None elsewhere."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 (starttime), counted after the ")" of the command
        with open("/proc/stat") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


GC_FREEZE_ENV = "GOLDEN_GC_FREEZE"  # "0": freeze_heap does nothing


def freeze_heap(collect: bool = True) -> None:
    """Move every object alive now (imported modules, classes, functions) into the cyclic
    collector's permanent generation (``gc.freeze``), after one collection unless ``collect`` is
    False (a freshly forked child: one collection would scan the whole inherited heap once).
    Called by the zygote (``harness.runner.zygote``) once its preloads are in, by a warm host
    once it started, and by a rollout engine process forked by its actor's fork server:
    the process and its forked children never scan those objects again (about 330,000 once
    torch is imported; every full collection of a policy rank walked them all) and never write
    their collector fields, so the pages a child shares with the zygote stay shared. They are
    never freed, as they would not be anyway. No value a workload computes depends on it (the
    goldens are byte-identical with and without). ``GOLDEN_GC_FREEZE=0`` turns it off."""
    if os.environ.get(GC_FREEZE_ENV, "1").strip() == "0":
        return
    import gc

    if collect:
        gc.collect()
    gc.freeze()


_driver_frozen = False


def freeze_driver_heap() -> None:
    """:func:`freeze_heap` once per driver process, when its first run has imported the workload
    half (torch, ray, the runner): a ``pytest -m golden`` driver ran nine full collections over
    that heap, about 1 s of its critical path."""
    global _driver_frozen
    if not _driver_frozen:
        _driver_frozen = True
        freeze_heap()


def run_setup_hook(name: str) -> None:
    """Call the worker setup hook ``name`` (``package.module.function``) in this process, as Ray
    calls a job's ``worker_process_setup_hook`` in a fresh worker; a name that does not resolve
    raises ValueError naming it."""
    module, _, func = name.rpartition(".")
    try:
        hook = getattr(importlib.import_module(module), func) if module else None
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"GOLDEN_WORKER_SETUP_HOOK={name!r} does not resolve: {exc}") from exc
    if not callable(hook):
        raise ValueError(f"GOLDEN_WORKER_SETUP_HOOK={name!r} is not a module.function")
    hook()


def undo_setup_hook(name: str) -> int:
    """Undo what the setup hook ``name`` patched: its module's ``undo()`` (``harness.mutations``
    has one); returns what it returns. Raises when the module has none or the undo fails."""
    module = importlib.import_module(name.rpartition(".")[0])
    undo = getattr(module, "undo", None)
    if not callable(undo):
        raise RuntimeError(f"GOLDEN_WORKER_SETUP_HOOK={name!r}: its module has no undo()")
    return int(undo())


@dataclass
class ProcessBaseline:
    """The process-wide state of a fresh worker process (see module docstring)."""

    environ: dict[str, str]
    cwd: str
    torch_rng: Any
    py_rng: Any
    np_rng: Any
    threads: int
    interop_threads: int
    deterministic: bool
    deterministic_warn_only: bool
    grad_enabled: bool
    default_dtype: Any
    matmul_precision: str
    started: float = field(default_factory=time.time)

    @classmethod
    def capture(cls) -> ProcessBaseline:
        import torch

        try:
            import numpy as np

            np_rng = np.random.get_state()
        except ImportError:  # pragma: no cover - numpy comes with torch here
            np_rng = None
        return cls(
            environ=dict(os.environ), cwd=os.getcwd(), torch_rng=torch.get_rng_state(), py_rng=random.getstate(),
            np_rng=np_rng, threads=torch.get_num_threads(), interop_threads=torch.get_num_interop_threads(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            grad_enabled=torch.is_grad_enabled(), default_dtype=torch.get_default_dtype(),
            matmul_precision=torch.get_float32_matmul_precision(),
        )

    def restore(self, env_vars: dict[str, str] | None = None) -> None:
        """Put the captured state back, then apply the next workload's ``env_vars``."""
        import torch

        os.environ.clear()
        os.environ.update(self.environ)
        os.environ.update({k: str(v) for k, v in (env_vars or {}).items()})
        os.chdir(self.cwd)
        torch.set_rng_state(self.torch_rng)
        random.setstate(self.py_rng)
        if self.np_rng is not None:
            import numpy as np

            np.random.set_state(self.np_rng)
        torch.set_num_threads(self.threads)
        # set_num_interop_threads may only be called before the first inter-op use; it never changes here
        torch.use_deterministic_algorithms(self.deterministic, warn_only=self.deterministic_warn_only)
        torch.set_grad_enabled(self.grad_enabled)
        torch.set_default_dtype(self.default_dtype)
        torch.set_float32_matmul_precision(self.matmul_precision)


class WarmHost:
    """What the warm process hosts (``PolicyWorkerHost``, ``RolloutWorkerHost``) share: the
    fresh-process baseline captured at start, the adopted flag, and setup hooks applied or
    undone only while no workload holds the process. ``warm_role`` names the host in errors."""

    warm_role = "worker"

    def __init__(self) -> None:  # nothing of a workload yet
        self._baseline = ProcessBaseline.capture()
        self._adopted = False
        freeze_heap()  # what it imported (ray's modules, in a worker forked from the zygote) too

    def run_setup_hook(self, name: str) -> None:
        """Apply a worker setup hook before ``adopt`` (``undo_setup_hook`` after ``retire``)."""
        if self._adopted:
            raise RuntimeError(f"warm {self.warm_role} process {os.getpid()}: setup hook while adopted")
        run_setup_hook(name)

    def undo_setup_hook(self, name: str) -> int:
        """Undo the hook's patches after ``retire``; raises if that is not certain."""
        if self._adopted:
            raise RuntimeError(f"warm {self.warm_role} process {os.getpid()}: hook undo while adopted")
        return undo_setup_hook(name)
