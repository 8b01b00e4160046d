"""Driving a rollout profiler around engine start-up and rollout attempts.

Reference section 2.4. :class:`RolloutProfilerHooks` sits between a rollout
process (the ``RolloutWorker`` for a sync TP=1 engine, otherwise each internal
engine process) and its optional profiler; with no profiler every method is
a no-op.

State machine: ``init window: none -> open -> closed`` (once), then any
number of rollout windows ``begin -> finish | abort``. Invariants:

* ``end_engine_initialization`` receives the exact token ``begin`` returned,
  and is called even when engine creation fails;
* no rollout window opens before the init window closed;
* at most one finish-or-abort per begun rollout; abort without an open window
  is a no-op (idempotent); a failing abort never masks the rollout's error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from harness.plugins.loader import ROLLOUT_PROFILER_ENV
from harness.plugins.protocols import RolloutProfiler

log = logging.getLogger(__name__)

REASON_ROLLOUT_ERROR = "grpo_rollout_error"

# Dotted paths of the harness's own engine worker class(es); the only custom
# ``rollout.worker_cls`` values that compose with in-engine rollout profiling.
SUPPORTED_ENGINE_WORKER_CLASSES: frozenset[str] = frozenset(
    {"harness.rollout.engine_worker.EngineWorker"}
)

_INIT_NONE, _INIT_OPEN, _INIT_CLOSED = "none", "open", "closed"


def validate_rollout_profiler_topology(*, pp: int, ep: int) -> None:
    """Rollout profiling supports any TP but only ``pp == 1`` and ``ep == 1``.

    Call before any engine is created when a rollout profiler is configured.
    """
    if pp != 1:
        raise ValueError(f"rollout.pp must be 1 when a rollout profiler is configured (got {pp})")
    if ep != 1:
        raise ValueError(f"rollout.ep must be 1 when a rollout profiler is configured (got {ep})")


def _dotted_name(worker_cls: object) -> str:
    if isinstance(worker_cls, str):
        return worker_cls
    if isinstance(worker_cls, type):
        return f"{worker_cls.__module__}.{worker_cls.__qualname__}"
    return repr(worker_cls)


def validate_engine_worker_cls(worker_cls: object) -> None:
    """Accept ``None`` or the harness's own engine worker (class or dotted path).

    Any other custom engine worker class cannot host the in-engine profiler
    and is refused with ``ValueError`` before the engine is created.
    """
    if worker_cls is None:
        return
    name = _dotted_name(worker_cls)
    if name not in SUPPORTED_ENGINE_WORKER_CLASSES:
        raise ValueError(
            f"rollout.worker_cls {name!r} is not supported with rollout profiling; "
            f"use null or one of {sorted(SUPPORTED_ENGINE_WORKER_CLASSES)}"
        )


def rollout_profiler_rank(rank_prefix: int, internal_rank: int) -> int:
    """Dense rollout rank of internal engine process ``internal_rank``."""
    for name, value in (("rank_prefix", rank_prefix), ("internal_rank", internal_rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return rank_prefix + internal_rank


def outer_rollout_rank(environ: Mapping[str, str] | None = None) -> int:
    """Rank of the profiler in a sync TP=1 ``RolloutWorker``: ``int(environ["RANK"])``."""
    env = os.environ if environ is None else environ
    raw = env.get("RANK")
    if raw is None:
        raise RuntimeError("RANK is not set in the rollout worker environment; cannot place the rollout profiler")
    try:
        return int(raw)
    except ValueError:
        raise RuntimeError(f"RANK={raw!r} in the rollout worker environment is not an int") from None


def rollout_profiler_class_path(
    env_vars: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The configured rollout class path; the worker's ``env_vars`` win over the driver env."""
    if env_vars is not None and env_vars.get(ROLLOUT_PROFILER_ENV):
        return env_vars[ROLLOUT_PROFILER_ENV]
    env = os.environ if environ is None else environ
    return env.get(ROLLOUT_PROFILER_ENV) or None


class RolloutProfilerHooks:
    """Lifecycle driver for one rollout process's profiler (``None`` = disabled)."""

    def __init__(self, profiler: RolloutProfiler | None) -> None:
        self._profiler = profiler
        self._init_state = _INIT_NONE
        self._token: object = None
        self._rollout_open = False
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self._profiler is not None

    @property
    def init_open(self) -> bool:
        return self._init_state == _INIT_OPEN

    @property
    def rollout_open(self) -> bool:
        return self._rollout_open

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("the rollout profiler is closed")

    # -- engine initialisation window -------------------------------------------------
    def begin_engine_init(self) -> None:
        """Open the init window (before the engine is created); keeps the token."""
        if self._profiler is None:
            return
        self._check_usable()
        if self._init_state != _INIT_NONE:
            raise RuntimeError(
                f"the rollout profiler engine-initialization window was already begun ({self._init_state})"
            )
        self._token = self._profiler.begin_engine_initialization()
        self._init_state = _INIT_OPEN

    def end_engine_init(self) -> None:
        """Close the init window (after warm-up) with begin's exact token."""
        if self._profiler is None:
            return
        if self._init_state != _INIT_OPEN:
            raise RuntimeError("no rollout profiler engine-initialization window is open")
        self._init_state = _INIT_CLOSED
        token, self._token = self._token, None
        self._profiler.end_engine_initialization(token)

    @contextmanager
    def engine_init(self) -> Iterator[None]:
        """Init window around engine creation; on failure still ends it, then re-raises."""
        self.begin_engine_init()
        try:
            yield
        except BaseException as exc:
            try:
                self.end_engine_init()
            except Exception as end_exc:
                log.exception("rollout profiler end_engine_initialization failed")
                exc.add_note(f"rollout profiler end_engine_initialization also failed: {end_exc!r}")
            raise
        self.end_engine_init()

    # -- rollout windows ------------------------------------------------------------
    @contextmanager
    def engine_init_or_close(self, what: str = "engine") -> Iterator[None]:
        """Begin the init window and run the body (engine creation and warm-up);
        the window stays open for the owner's ``end_engine_init``. If the body
        raises, the profiler is closed (ending the window as aborted) and a
        failure of that close is attached to the original error as a note."""
        self.begin_engine_init()
        try:
            yield
        except BaseException as exc:
            try:
                self.close()
            except Exception as close_exc:  # noqa: BLE001 - attached to the init error as a note
                exc.add_note(f"rollout profiler close after failed {what} init also failed: {close_exc!r}")
            raise

    def begin_rollout(self, step_id: int | str) -> None:
        """Open a rollout window; the window counts as open even if the profiler's begin raises."""
        if self._profiler is None:
            return
        self._check_usable()
        if self._init_state != _INIT_CLOSED:
            raise RuntimeError("begin_rollout before the rollout profiler engine-initialization window closed")
        if self._rollout_open:
            raise RuntimeError("a rollout profiler window is already open")
        self._rollout_open = True
        self._profiler.begin_rollout(step_id=step_id)

    def finish_rollout(self) -> None:
        if self._profiler is None:
            return
        if not self._rollout_open:
            raise RuntimeError("finish_rollout without an open rollout profiler window")
        self._rollout_open = False
        self._profiler.finish_rollout()

    def abort_rollout(self, reason: str, cause: BaseException | None = None) -> None:
        """Abort the open window (no-op if none); with ``cause`` a failure becomes a note on it."""
        if self._profiler is None or not self._rollout_open:
            return
        self._rollout_open = False
        try:
            self._profiler.abort_rollout(reason=reason)
        except Exception as abort_exc:
            if cause is None:
                raise
            log.exception("rollout profiler abort_rollout(reason=%r) failed", reason)
            cause.add_note(f"rollout profiler abort_rollout(reason={reason!r}) also failed: {abort_exc!r}")

    @contextmanager
    def rollout(self, step_id: int | str) -> Iterator[None]:
        """One rollout attempt: begin, body, finish; any error aborts ``grpo_rollout_error``."""
        if self._profiler is not None and self._rollout_open:
            raise RuntimeError("a rollout profiler window is already open")
        try:
            self.begin_rollout(step_id)
            yield
        except BaseException as exc:
            self.abort_rollout(REASON_ROLLOUT_ERROR, exc)
            raise
        self.finish_rollout()

    # -- shutdown --------------------------------------------------------------------
    def close(self, cleanup: Callable[[], Any] | None = None) -> None:
        """End a still-open init window, close the profiler, then ``cleanup`` in ``finally``.

        A rollout window still open is left to the profiler's ``close``; no
        call reaches the profiler afterwards.
        """
        try:
            if self._profiler is not None and not self._closed:
                self._closed = True
                self._rollout_open = False
                try:
                    if self._init_state == _INIT_OPEN:
                        self.end_engine_init()
                finally:
                    self._profiler.close()
        finally:
            if cleanup is not None:
                cleanup()


class RolloutLifecycleRPC:
    """The rollout-profiler lifecycle as an engine unit exposes it to its owner.

    Mixed into every unit that owns a profiler next to an engine (the native
    ``EngineWorker``, the in-actor vLLM engine); each keeps its
    :class:`RolloutProfilerHooks` in ``self.hooks``.
    """

    hooks: RolloutProfilerHooks

    def end_engine_initialization(self) -> None:
        self.hooks.end_engine_init()

    def begin_rollout(self, step_id: int | str) -> None:
        self.hooks.begin_rollout(step_id)

    def finish_rollout(self) -> None:
        self.hooks.finish_rollout()

    def abort_rollout(self, reason: str) -> None:
        self.hooks.abort_rollout(reason)

    def close_profiler(self) -> None:
        self.hooks.close()

    def pid(self) -> int:
        return os.getpid()
