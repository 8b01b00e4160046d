"""Recording profiler plugins: every contract call, in order, in memory.

Real plugins (they satisfy the contracts and load by class path), used by the
lifecycle tests of the hooks and of the workers that drive them. ``fail``
makes a method raise :class:`InjectedFailure` on its n-th call (0 = always).
Calls are recorded as tuples: ``("begin",)``, ``("abort", reason)``,
``("begin_rollout", step_id)``, ``("end_init", token)``, ...
"""

from __future__ import annotations

from typing import Any


class InjectedFailure(Exception):
    """Raised by a recording profiler on request (see ``fail``)."""


class _Recorder:
    def __init__(self, *, rank: int = 0, fail: dict[str, int] | None = None) -> None:
        self.rank = rank
        self.calls: list[tuple[Any, ...]] = []
        self.fail = dict(fail or {})  # method -> raise on the n-th call (1-based); 0 = always
        self.failed: list[int] = []  # indices into ``calls`` of the calls that raised

    def _record(self, *call: Any) -> None:
        self.calls.append(call)
        name = call[0]
        if name in self.fail:
            n = sum(1 for c in self.calls if c[0] == name)
            if self.fail[name] in (0, n):
                self.failed.append(len(self.calls) - 1)
                raise InjectedFailure(f"{name} failed")

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


class RecordingPolicyProfiler(_Recorder):
    def begin_train_step(self) -> None:
        self._record("begin")

    def finish_train_step(self) -> None:
        self._record("finish")

    def abort_train_step(self, *, reason: str) -> None:
        self._record("abort", reason)

    def close(self) -> None:
        self._record("close")


class RecordingRolloutProfiler(_Recorder):
    def begin_engine_initialization(self) -> object:
        self._record("begin_init")
        self.token = object()
        return self.token

    def end_engine_initialization(self, token: object) -> None:
        self._record("end_init", token)

    def begin_rollout(self, *, step_id: int | str) -> None:
        self._record("begin_rollout", step_id)

    def finish_rollout(self) -> None:
        self._record("finish_rollout")

    def abort_rollout(self, *, reason: str) -> None:
        self._record("abort_rollout", reason)

    def close(self) -> None:
        self._record("close")
