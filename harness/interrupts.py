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
* ``exit_code()`` also clears CPython's record of an unhandled interrupt. CPython marks one
  whenever a KeyboardInterrupt ends a *string* ``exec``/``eval`` (``dataclasses`` and
  ``namedtuple`` build their methods that way, so a signal during an import hits it), even
  when a caller catches it; under ``python -m`` the interpreter then ends by killing itself with
  SIGINT (exit -2) whatever code ``main`` returned. Every string eval starts by clearing that
  mark, so one tiny ``eval`` here makes the exit code the one returned.
* An interrupt is never lost. A KeyboardInterrupt raised where Python cannot pass it on (a
  ``__del__``, a weakref callback such as the import system's module-lock cleanup) is
  "ignored" by CPython: printed as a traceback, the command going on to a verdict. While
  ``install()`` is in force, such an interrupt is not printed but delivered again
  (``_thread.interrupt_main`` from a timer thread 10 ms later), so it is raised in the main
  thread's ordinary code instead. The ``golden`` command also treats a noted signal as an
  interruption when the command returns, in case the delivery came too late.

The ``golden`` command exits ``exit_code()`` whenever it is interrupted; the pytest plugin
stops the session at the first interrupted workload (the remaining ones do not run) and
exits with ``exit_code()`` too. Standard library only (gate half).
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
from typing import Any

__all__ = ["exit_code", "install", "last", "note", "reset", "restore"]

_last: int | None = None
_unraisable_before: Any = None  # sys.unraisablehook while install() is in force


def note(signum: int) -> None:
    global _last
    _last = int(signum)


def last() -> int | None:
    return _last


def reset() -> None:
    global _last
    _last = None


def exit_code() -> int:
    eval("None")  # noqa: S307 - clears CPython's unhandled-interrupt mark (module docstring)
    return 128 + (_last if _last is not None else int(signal.SIGINT))


def _raise_interrupt(signum: int, frame: Any) -> None:
    note(signum)
    raise KeyboardInterrupt


def _deliver_again(unraisable: Any) -> None:
    """sys.unraisablehook: an interrupt swallowed by a callback is raised again (docstring)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _last is not None:
        # Tripped from another thread a moment later: tripped from here, the handler would run
        # (and raise) inside this hook, which CPython would report as one more ignored error.
        threading.Timer(0.01, _thread.interrupt_main, (_last,)).start()
        return
    (_unraisable_before or sys.__unraisablehook__)(unraisable)


def install() -> tuple[Any, Any, Any] | None:
    """SIGTERM -> KeyboardInterrupt (and SIGINT noted), a swallowed interrupt delivered
    again; what ``restore`` needs (the previous SIGTERM and SIGINT handlers and unraisable
    hook), or None off the main thread."""
    global _unraisable_before
    try:
        previous = (signal.signal(signal.SIGTERM, _raise_interrupt), signal.signal(signal.SIGINT, _raise_interrupt),
                    sys.unraisablehook)
    except ValueError:  # not the main thread
        return None
    if sys.unraisablehook is not _deliver_again:
        _unraisable_before = sys.unraisablehook
        sys.unraisablehook = _deliver_again
    return previous


def restore(previous: tuple[Any, Any, Any] | None) -> None:
    """Put back what ``install`` replaced."""
    if previous is None:
        return
    try:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    except (ValueError, TypeError):
        pass
    sys.unraisablehook = previous[2]
