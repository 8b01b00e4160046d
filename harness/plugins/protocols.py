"""The two profiler plugin contracts (NeMo RL PR #3573; docs/plugins.md section 2).

A plugin is any class with these methods; it is built once per worker
process as ``cls(rank=rank)``. The harness never subclasses-checks plugins:
the loader checks the method names in ``*_METHODS``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

POLICY_PROFILER_METHODS: tuple[str, ...] = (
    "begin_train_step",
    "finish_train_step",
    "abort_train_step",
    "close",
)
ROLLOUT_PROFILER_METHODS: tuple[str, ...] = (
    "begin_engine_initialization",
    "end_engine_initialization",
    "begin_rollout",
    "finish_rollout",
    "abort_rollout",
    "close",
)


@runtime_checkable
class PolicyProfiler(Protocol):
    """Observes policy training steps on one policy rank (global rank)."""

    def __init__(self, *, rank: int) -> None: ...

    def begin_train_step(self) -> None:
        """A training update starts (monolithic ``train`` or split begin)."""

    def finish_train_step(self) -> None:
        """The update begun last completed (called at most once per begin)."""

    def abort_train_step(self, *, reason: str) -> None:
        """The update begun last failed or was abandoned (at most once per begin)."""

    def close(self) -> None:
        """Worker shutdown; no further calls follow."""


@runtime_checkable
class RolloutProfiler(Protocol):
    """Observes engine start-up and rollout attempts in one rollout process."""

    def __init__(self, *, rank: int) -> None: ...

    def begin_engine_initialization(self) -> object:
        """Engine creation starts; the returned token is passed back to ``end``."""

    def end_engine_initialization(self, token: object) -> None:
        """Engine creation and warm-up finished (or failed); ``token`` is begin's."""

    def begin_rollout(self, *, step_id: int | str) -> None:
        """A rollout attempt starts; the harness passes ``"step{N}/attempt{M}"``."""

    def finish_rollout(self) -> None:
        """The open rollout attempt completed."""

    def abort_rollout(self, *, reason: str) -> None:
        """The open rollout attempt failed."""

    def close(self) -> None:
        """Worker shutdown; no further calls follow."""
