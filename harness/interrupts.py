"""How a gate run ends on SIGINT / SIGTERM (issue 41): at once, with the signal's exit code.

Contract
--------
* ``install()`` (main thread only; elsewhere a no-op returning None) makes SIGTERM raise
  ``KeyboardInterrupt``, as Ctrl-C does, so every ``finally`` runs (workers stopped, run.json
  marked interrupted) and returns the previous handler. ``restore(previous)`` puts it back.
* ``note(signum)`` records the signal that interrupted (the runner's own SIGTERM handler
  calls it too); ``exit_code()`` is ``128 + signum`` of the last one noted (130 for Ctrl-C,
  143 for SIGTERM), 130 when none was noted (a ``KeyboardInterrupt`` from Ctrl-C).
* ``reset()`` forgets it (a new command or session starts clean).

The ``golden`` command exits ``exit_code()`` whenever it is interrupted; the pytest plugin
stops the session at the first interrupted workload (the remaining ones do not run) and
exits with ``exit_code()`` too. Standard library only (gate half).
"""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["exit_code", "install", "last", "note", "reset", "restore"]

_last: int | None = None


def note(signum: int) -> None:
    global _last
    _last = int(signum)


def last() -> int | None:
    return _last


def reset() -> None:
    global _last
    _last = None


def exit_code() -> int:
    return 128 + (_last if _last is not None else int(signal.SIGINT))


def _raise_interrupt(signum: int, frame: Any) -> None:
    note(signum)
    raise KeyboardInterrupt


def install() -> tuple[Any, Any] | None:
    """SIGTERM -> KeyboardInterrupt (and SIGINT noted); the previous (SIGTERM, SIGINT)
    handlers, or None off the main thread."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt), signal.signal(signal.SIGINT, _raise_interrupt)
    except ValueError:  # not the main thread
        return None
    return previous


def restore(previous: tuple[Any, Any] | None) -> None:
    """Put back what ``install`` replaced."""
    if previous is None:
        return
    try:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    except (ValueError, TypeError):
        pass
