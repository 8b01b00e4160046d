"""The dispatch-mode method of recording collectives (``HARNESS_TRACE_COLLECTIVES=mode``).

A ``TorchDispatchMode`` entered on the calling thread: every op of the window makes
a Python round trip, so it is only the fallback where the kernel method
(``harness.profiler.collectives``) cannot run.
"""

from __future__ import annotations

import threading
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from harness.profiler.collective_ops import COLLECTIVE_NAMESPACES, IGNORED_OPS, RecorderThread, entry

__all__ = ["ModeCollectiveRecorder"]

class ModeCollectiveRecorder(RecorderThread, TorchDispatchMode):
    """The dispatch-mode method: sees every op of the window (slow), records collectives.

    Use ``start()`` / ``stop()``; both must run on the same thread, because
    dispatch modes are thread-local.
    """

    method = "mode"

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[list[Any]] = []
        self._thread: int | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        namespace = func.namespace
        if namespace in COLLECTIVE_NAMESPACES:
            name = func._schema.name.split("::", 1)[-1]
            if name not in IGNORED_OPS:
                self.entries.append(entry(name, namespace, args, kwargs))
        return func(*args, **kwargs)

    def start(self) -> None:
        self._refuse_if_started()
        self.__enter__()
        self._thread = threading.get_ident()

    def stop(self) -> list[list[Any]]:
        """Leave the mode; returns the entries recorded since ``start``."""
        if self._thread is None:
            return self.entries
        if self._thread != threading.get_ident():
            raise RuntimeError(
                "collective recorder stopped on a different thread than it was started on "
                "(dispatch modes are per thread)"
            )
        self._thread = None
        self.__exit__(None, None, None)
        return self.entries
