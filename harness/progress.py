"""Progress of a golden command on stderr: a live display on a terminal, timestamped lines elsewhere.

The flows report phases ("loading torch and ray", "starting Ray", "spawning 8
policy workers", "step 2/3", "postflight", "compare") and notes (one-off lines);
a reporter shows them:

* ``RichProgress`` (stderr is a terminal): a live line with a spinner, the
  phase, its elapsed time and, during the training steps, a bar with the
  elapsed time and an ETA (mean step time x steps left); each phase and note
  also stays as a permanent line above it. ``rich`` is imported only here.
* ``PlainProgress`` (a pipe, a CI log, pytest): one line per phase and note,
  ``[golden HH:MM:SS +12.3s] text``, and a heartbeat line ``... still <phase>``
  whenever ``heartbeat_s`` (4 s) passed without a line, so a log never goes
  silent for more than ~5 s, also while the driver is blocked in an import or a
  ``ray.get``. The heartbeat decision (``tick``) reads an injectable clock, so
  tests drive it deterministically.

Contract: a reporter writes to its stream (stderr) only, never to stdout and
never into a run directory or a golden; nothing it does changes an artifact.
``GOLDEN_PROGRESS`` = ``auto`` (default) | ``rich`` | ``plain`` | ``off``.

The functions ``phase(say, text)`` and ``step(say, i, n)`` accept any
``say`` callable (a reporter, a plain ``print``-like function, or None), so the
runner keeps its ``say(str)`` interface. Standard library only at import time
(the gate half uses it).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Self

__all__ = ["HEARTBEAT_S", "PlainProgress", "Progress", "RichProgress", "make_progress", "phase", "step"]

HEARTBEAT_S = 4.0    # a heartbeat line after this long without output (plain mode)
POLL_S = 0.5         # how often the heartbeat thread looks
MODE_ENV = "GOLDEN_PROGRESS"

Clock = Callable[[], float]


def phase(say: Callable[[str], None] | None, text: str) -> None:
    """Start a phase on ``say`` (a reporter), or say ``text`` (a plain callable)."""
    if say is None:
        return
    start = getattr(say, "phase", None)
    (start or say)(text)


def step(say: Callable[[str], None] | None, index: int, total: int) -> None:
    """Training step ``index`` of ``total`` starts (reporters only; a plain callable gets nothing)."""
    start = getattr(say, "step", None)
    if start is not None:
        start(index, total)


def _secs(value: float) -> str:
    value = max(0.0, value)
    if value < 60:
        return f"{value:.1f}s"
    minutes, seconds = divmod(round(value), 60)
    return f"{minutes}m{seconds:02d}s"


class _Tracker:
    """Phase and step bookkeeping shared by the reporters (times from ``clock``)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.started = clock()
        self.phase = "starting"
        self.phase_started = self.started
        self.total: int | None = None
        self.index: int | None = None
        self.steps_started: float | None = None
        self.step_times: list[float] = []
        self._step_started: float | None = None

    def begin_phase(self, text: str) -> None:
        self.phase, self.phase_started = text, self.clock()
        self.total = self.index = None
        self._step_started = None

    def begin_step(self, index: int, total: int) -> None:
        now = self.clock()
        if self._step_started is not None and self.index is not None and index == self.index + 1:
            self.step_times.append(now - self._step_started)
        if self.steps_started is None or self.total is None:
            self.steps_started = now
        self.index, self.total, self._step_started = index, total, now
        self.phase, self.phase_started = f"step {index}/{total}", now

    def eta(self) -> float | None:
        """Mean duration of the finished steps x the steps left (this one included); None before one finished."""
        if self.index is None or self.total is None or not self.step_times:
            return None
        mean = sum(self.step_times) / len(self.step_times)
        left = self.total - self.index + 1 - (self.clock() - (self._step_started or self.clock())) / mean
        return max(0.0, mean * left)

    def step_text(self) -> str:
        elapsed = self.clock() - (self.steps_started or self.clock())
        eta = self.eta()
        return f"elapsed {_secs(elapsed)}, ETA {_secs(eta) if eta is not None else '?'}"


class Progress:
    """A reporter that shows nothing (``-q``, ``GOLDEN_PROGRESS=off``); the base of the others."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.tracker = _Tracker(clock)

    def phase(self, text: str) -> None:
        self.tracker.begin_phase(text)

    def step(self, index: int, total: int) -> None:
        self.tracker.begin_step(index, total)

    def note(self, text: str) -> None:
        pass

    def __call__(self, text: str) -> None:
        self.note(text)

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PlainProgress(Progress):
    """Timestamped lines on ``stream`` and a heartbeat when ``heartbeat_s`` passes without one.

    ``start_heartbeat()`` starts the thread that calls ``tick()`` every ``POLL_S``;
    tests call ``tick()`` themselves with a fake ``clock`` and ``wall``."""

    def __init__(self, stream: IO[str] | None = None, *, clock: Clock = time.monotonic,
                 wall: Clock = time.time, heartbeat_s: float = HEARTBEAT_S, label: str = "golden") -> None:
        super().__init__(clock)
        self.stream = stream if stream is not None else sys.stderr
        self.wall = wall
        self.heartbeat_s = heartbeat_s
        self.label = label
        self.last_line = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _emit(self, text: str) -> None:
        with self._lock:
            now = self.tracker.clock()
            stamp = time.strftime("%H:%M:%S", time.localtime(self.wall()))
            lines = str(text).rstrip("\n").splitlines() or [""]
            out = "".join(f"[{self.label} {stamp} +{now - self.tracker.started:.1f}s] {line}\n" for line in lines)
            try:
                self.stream.write(out)
                self.stream.flush()
            except (OSError, ValueError):  # a closed stream must not fail the run
                pass
            self.last_line = now

    def phase(self, text: str) -> None:
        super().phase(text)
        self._emit(text)

    def step(self, index: int, total: int) -> None:
        super().step(index, total)
        self._emit(f"step {index}/{total} ({self.tracker.step_text()})")

    def note(self, text: str) -> None:
        self._emit(text)

    def tick(self) -> bool:
        """Write a heartbeat line if ``heartbeat_s`` passed since the last line; True when it did."""
        t = self.tracker
        if t.clock() - self.last_line < self.heartbeat_s:
            return False
        detail = t.step_text() if t.total is not None else f"{_secs(t.clock() - t.phase_started)} in this phase"
        self._emit(f"... still {t.phase} ({detail})")
        return True

    def start_heartbeat(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="golden-progress-heartbeat", daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(POLL_S):
            self.tick()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * POLL_S)
        self._thread = None


class RichProgress(Progress):
    """A live ``rich`` display on a terminal stream (stderr); phases and notes stay printed above it."""

    def __init__(self, stream: IO[str] | None = None, *, clock: Clock = time.monotonic) -> None:
        super().__init__(clock)
        from rich.console import Console
        from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichBar

        self.console = Console(file=stream if stream is not None else sys.stderr, highlight=False)
        self.bar = RichBar(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                           TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                           console=self.console, transient=True, refresh_per_second=4,
                           # Python-level stderr writes (Ray's log lines) go above the display;
                           # stdout is the report and is never redirected into it.
                           redirect_stdout=False, redirect_stderr=True)
        self.task = self.bar.add_task("starting", total=None, detail="")
        self.bar.start()
        self._closed = False

    def _line(self, text: str, style: str = "") -> None:
        elapsed = self.tracker.clock() - self.tracker.started
        for line in str(text).rstrip("\n").splitlines() or [""]:
            self.console.print(f"[dim]+{elapsed:6.1f}s[/dim] {line}" if not style else
                               f"[dim]+{elapsed:6.1f}s[/dim] [{style}]{line}[/{style}]", markup=True,
                               highlight=False, soft_wrap=True)

    def phase(self, text: str) -> None:
        super().phase(text)
        self._line(_escape(text), "cyan")
        self.bar.reset(self.task, description=_escape(text), total=None, detail="")
        self.bar.refresh()

    def step(self, index: int, total: int) -> None:
        first = self.tracker.total is None
        super().step(index, total)
        eta = self.tracker.eta()
        description, detail = f"step {index}/{total}", f"ETA {_secs(eta) if eta is not None else '?'}"
        if first:  # the elapsed column then counts from the first step
            self.bar.reset(self.task, description=description, total=total, completed=index - 1, detail=detail)
        else:
            self.bar.update(self.task, description=description, total=total, completed=index - 1, detail=detail)
        self.bar.refresh()

    def note(self, text: str) -> None:
        self._line(_escape(text))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.bar.stop()


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(str(text))


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError, OSError):
        return False


def make_progress(*, quiet: bool = False, stream: IO[str] | None = None, mode: str | None = None,
                  label: str = "golden", clock: Clock = time.monotonic, heartbeat: bool = True) -> Progress:
    """The reporter for a command: ``off``/``quiet`` -> silent, a terminal -> rich, else plain lines
    with a running heartbeat thread (``heartbeat=False``: the caller calls ``tick()``).
    ``mode`` (else ``$GOLDEN_PROGRESS``, else ``auto``) forces one."""
    stream = stream if stream is not None else sys.stderr
    mode = (mode or os.environ.get(MODE_ENV) or "auto").strip().lower()
    if quiet or mode == "off":
        return Progress(clock)
    if mode == "rich" or (mode == "auto" and _is_terminal(stream)):
        try:
            return RichProgress(stream, clock=clock)
        except ImportError:  # rich is a core dependency; a broken install still gets plain lines
            pass
    plain = PlainProgress(stream, label=label, clock=clock)
    return plain.start_heartbeat() if heartbeat else plain
