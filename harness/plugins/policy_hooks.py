"""Driving a policy profiler around training updates (docs/plugins.md section 3).

:class:`PolicyProfilerHooks` sits between a policy worker and its (optional)
profiler. The worker routes its train entry points through it; with no
profiler every method is a plain call.

Invariants:

* at most one ``finish_train_step`` / ``abort_train_step`` per begun step: the
  step is marked closed *before* the profiler is told, so a failing finish is
  never followed by an abort, and aborting a closed step is a no-op;
* a second begin while a profiler step is open raises
  ``RuntimeError("a policy profiler step is already open")``;
* the worker's exception always wins: a failing abort is attached to it as a
  note (``BaseException.add_note``) and logged, never raised instead;
* ``finish_train_step`` runs only after the wrapped worker method returned.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from harness.plugins.protocols import PolicyProfiler

log = logging.getLogger(__name__)

T = TypeVar("T")

REASON_TRAIN_ERROR = "policy_train_error"
REASON_BEGIN_ERROR = "policy_train_begin_error"
REASON_MICROBATCH_ERROR = "policy_train_microbatch_error"
REASON_FINISH_ERROR = "policy_train_finish_error"
REASON_STEP_ABORTED = "policy_train_step_aborted"
ABORT_REASONS = (
    REASON_TRAIN_ERROR,
    REASON_BEGIN_ERROR,
    REASON_MICROBATCH_ERROR,
    REASON_FINISH_ERROR,
    REASON_STEP_ABORTED,
)

STEP_ALREADY_OPEN = "a policy profiler step is already open"
EVAL_MODE_POSITION = 2  # train(data, loss_fn, eval_mode, ...)


def _is_eval_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if "eval_mode" in kwargs:
        return bool(kwargs["eval_mode"])
    return len(args) > EVAL_MODE_POSITION and bool(args[EVAL_MODE_POSITION])


class PolicyProfilerHooks:
    """Lifecycle driver for one policy worker's profiler (``None`` = disabled)."""

    def __init__(self, profiler: PolicyProfiler | None) -> None:
        self._profiler = profiler
        self._step_open = False
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self._profiler is not None

    @property
    def step_open(self) -> bool:
        """A profiler step is begun and not yet finished or aborted."""
        return self._step_open

    # -- internal state transitions -------------------------------------------------
    def _open_step(self) -> None:
        """Mark a step open, then call the profiler's begin (caller aborts on failure)."""
        assert self._profiler is not None
        if self._closed:
            raise RuntimeError("the policy profiler is closed")
        if self._step_open:
            raise RuntimeError(STEP_ALREADY_OPEN)
        self._step_open = True
        self._profiler.begin_train_step()

    def _finish_step(self) -> None:
        if self._profiler is None or not self._step_open:
            return
        self._step_open = False
        self._profiler.finish_train_step()

    def _abort_step(self, reason: str, cause: BaseException | None) -> None:
        """Abort the open step; with ``cause`` an abort failure becomes a note on it."""
        if self._profiler is None or not self._step_open:
            return
        self._step_open = False
        try:
            self._profiler.abort_train_step(reason=reason)
        except Exception as abort_exc:
            if cause is None:
                raise
            log.exception("policy profiler abort_train_step(reason=%r) failed", reason)
            cause.add_note(f"policy profiler abort_train_step(reason={reason!r}) also failed: {abort_exc!r}")

    # -- monolithic train ------------------------------------------------------------
    def run_train(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn(*args, **kwargs)`` as one profiled update (unless eval mode).

        Eval mode is ``kwargs["eval_mode"]`` or, positionally, ``args[2]``
        (``train(data, loss_fn, eval_mode, ...)``). All arguments are forwarded.
        """
        if self._profiler is None or _is_eval_call(args, kwargs):
            return fn(*args, **kwargs)
        with self.train_step():
            return fn(*args, **kwargs)

    def wrap_train(self, fn: Callable[..., T]) -> Callable[..., T]:
        """Decorator form of :meth:`run_train` for a bound ``train`` method."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return self.run_train(fn, *args, **kwargs)

        return wrapper

    @contextmanager
    def train_step(self, *, eval_mode: bool = False) -> Iterator[None]:
        """Context-manager form: begin, body, finish; abort ``policy_train_error`` on error."""
        if self._profiler is None or eval_mode:
            yield
            return
        if self._step_open:
            raise RuntimeError(STEP_ALREADY_OPEN)
        try:
            self._open_step()
            yield
        except BaseException as exc:
            self._abort_step(REASON_TRAIN_ERROR, exc)
            raise
        self._finish_step()

    # -- split API -------------------------------------------------------------------
    def begin_step(self, fn: Callable[..., T], *args: Any, worker_step_open: bool, **kwargs: Any) -> T:
        """Wrap the worker's ``begin_train_step``.

        With a worker step already open, ``fn`` runs untouched so the worker
        raises its own nested-step error and the profiler is not involved.
        Otherwise the profiler step opens first; a failure of the profiler's
        begin or of ``fn`` aborts it with ``policy_train_begin_error``.
        """
        if self._profiler is None or worker_step_open:
            return fn(*args, **kwargs)
        if self._step_open:
            raise RuntimeError(STEP_ALREADY_OPEN)
        try:
            self._open_step()
            return fn(*args, **kwargs)
        except BaseException as exc:
            self._abort_step(REASON_BEGIN_ERROR, exc)
            raise

    def train_microbatch(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Wrap ``train_microbatch``: a failure aborts with ``policy_train_microbatch_error``."""
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            self._abort_step(REASON_MICROBATCH_ERROR, exc)
            raise

    def finish_step(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Wrap ``finish_train_step``: profiler finish only after ``fn`` fully returned."""
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._abort_step(REASON_FINISH_ERROR, exc)
            raise
        self._finish_step()
        return result

    def abort_step(self, fn: Callable[..., T] | None = None, *args: Any, **kwargs: Any) -> T | None:
        """Wrap an explicit ``abort_train_step``: run ``fn``, then abort ``policy_train_step_aborted``.

        The profiler is aborted even when ``fn`` raises (its error wins).
        Idempotent: with no open profiler step only ``fn`` runs.
        """
        try:
            result = fn(*args, **kwargs) if fn is not None else None
        except BaseException as exc:
            self._abort_step(REASON_STEP_ABORTED, exc)
            raise
        self._abort_step(REASON_STEP_ABORTED, None)
        return result

    # -- shutdown --------------------------------------------------------------------
    def close(self, cleanup: Callable[[], Any] | None = None) -> None:
        """Close the profiler first, then run ``cleanup`` in ``finally``.

        ``cleanup`` runs even when ``close`` raises; the close error then
        propagates after cleanup. Idempotent for the profiler. A step still
        open is left to the profiler's ``close`` (no abort is sent), and no
        call reaches the profiler afterwards.
        """
        try:
            if self._profiler is not None and not self._closed:
                self._closed = True
                self._step_open = False
                self._profiler.close()
        finally:
            if cleanup is not None:
                cleanup()
