"""The run's reaper: no process of a run outlives its driver, even a SIGKILLed one.

``Session`` starts ``Reaper(token)`` before ``ray.init`` and then puts
``GOLDEN_RUN_TOKEN=<token>`` into the driver's environment, so every process Ray
starts for the run (GCS, raylet, dashboard and runtime-env agents, workers, the
engines' internal processes) inherits it. The reaper is a separate process in a
session of its own (a Ctrl-C or a kill of the driver's process group does not
reach it), reading a pipe whose only writer is the driver and recording the
driver's process tree (pid and start time) every ``_WATCH_S`` while it waits.
When the pipe closes:

* the driver closed it after ``ray.shutdown`` (the driver is alive): every
  process still carrying the token is SIGKILLed;
* the kernel closed it because the driver died (SIGKILL included): every process
  carrying the token, every recorded process of the driver's tree that is still
  the same process, and every descendant of those, until three scans in a row
  find none. (Ray's agents rewrite their title over their environment, so the
  token alone does not find them; the tree does.)

Then the reaper exits.

Run as a script (``python reaper.py TOKEN DRIVER_PID``); standard library only,
Linux (``/proc``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

TOKEN_VAR = "GOLDEN_RUN_TOKEN"
_ROUNDS = 100
_PAUSE_S = 0.1
_WATCH_S = 0.5  # how often the reaper records the driver's process tree while it lives


def _stat(pid: int) -> tuple[bytes, int, int] | None:
    """(state, ppid, start time) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def _table() -> dict[int, tuple[bytes, int, int]]:
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            info = _stat(int(entry.name))
            if info is not None:
                table[int(entry.name)] = info
    return table


def descendants(root: int, table: dict[int, tuple[bytes, int, int]] | None = None) -> dict[int, int]:
    """pid -> start time of every live descendant of ``root``."""
    table = _table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = {}, [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if table[child][0] != b"Z":
                found[child] = table[child][2]
                stack.append(child)
    return found


def tagged(token: str, *, exclude: set[int]) -> list[int]:
    """Pids of live processes whose environment holds ``GOLDEN_RUN_TOKEN=token``. (A process
    that rewrites its title over its environment, as Ray's agents do, no longer shows it:
    the driver's process tree, watched while it lives, covers those.)"""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                env = handle.read()
        except OSError:  # gone, or not ours
            continue
        info = _stat(int(entry.name))
        if info is not None and info[0] != b"Z" and needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def sweep(token: str, *, exclude: set[int], known: dict[int, int] | None = None) -> list[int]:
    """SIGKILL every process of the run until three scans in a row find none: those tagged
    with ``token``, those in ``known`` (pid -> start time, so a reused pid is spared), and
    every descendant of either (collected before anything is killed, while parents still
    tell who their children are). Returns the pids killed."""
    killed: list[int] = []
    known = dict(known or {})
    quiet = 0
    for _ in range(_ROUNDS):
        table = _table()
        roots = set(tagged(token, exclude=exclude))
        roots |= {pid for pid, start in known.items() if pid in table and table[pid][2] == start
                  and table[pid][0] != b"Z"}
        victims = set(roots)
        for pid in roots:
            victims |= set(descendants(pid, table))
        victims -= exclude
        if not victims:
            quiet += 1
            if quiet >= 3:  # nothing is being started any more
                break
        else:
            quiet = 0
        for pid in sorted(victims):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
        time.sleep(_PAUSE_S)
    return killed


class Reaper:
    """The driver's handle: ``close()`` after a clean shutdown (sweeps what is left and
    waits for the reaper); the kernel closes the pipe if the driver dies."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.token_before: str | None = None  # the driver's TOKEN_VAR before start_reaper set it
        env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), token, str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, start_new_session=True, close_fds=True)

    def close(self, timeout_s: float = 60.0) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass


def start_reaper(tag: str = "") -> Reaper:
    """A reaper for this driver, its token exported as ``TOKEN_VAR`` so that every
    process started from now on (``ray.init`` included) carries it; ``stop_reaper``
    puts the previous value back."""
    import uuid

    reaper = Reaper(f"{os.getpid()}-{tag}{uuid.uuid4().hex[:12]}")
    reaper.token_before = os.environ.get(TOKEN_VAR)
    os.environ[TOKEN_VAR] = reaper.token
    return reaper


def stop_reaper(reaper: Reaper) -> None:
    """Restore the driver's ``TOKEN_VAR`` and close ``reaper`` (it sweeps whatever
    ``ray.shutdown`` left behind)."""
    if reaper.token_before is None:
        os.environ.pop(TOKEN_VAR, None)
    else:
        os.environ[TOKEN_VAR] = reaper.token_before
    reaper.close()


def _alive(pid: int) -> bool:
    info = _stat(pid)
    return info is not None and info[0] != b"Z"


def main(argv: list[str]) -> int:
    token, driver = argv[1], int(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe ends a reaper
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    known: dict[int, int] = {}
    fd = sys.stdin.fileno()
    while True:  # watch the driver's process tree until the pipe closes
        ready, _, _ = select.select([fd], [], [], _WATCH_S)
        if ready:
            try:
                if not os.read(fd, 65536):
                    break
            except OSError:
                break
        known.update(descendants(driver))
    if _alive(driver):  # a clean close: the driver lives on; only the run's tagged processes go
        killed = sweep(token, exclude={os.getpid(), driver})
    else:  # the driver died: everything that was its run goes
        known.pop(os.getpid(), None)
        killed = sweep(token, exclude={os.getpid(), driver}, known=known)
    if killed:
        print(f"golden reaper: killed {len(killed)} process(es) of run {token}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
