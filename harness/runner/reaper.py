"""The run's reaper: no process of a run outlives its driver, even a SIGKILLed one.

``Session`` starts ``Reaper(token)`` before ``ray.init`` and then puts
``GOLDEN_RUN_TOKEN=<token>`` into the driver's environment, so every process Ray
starts for the run (GCS, raylet, dashboard and runtime-env agents, workers, the
engines' internal processes) inherits it. The reaper is a separate process in a
session of its own (a Ctrl-C or a kill of the driver's process group does not
reach it), blocked reading a pipe whose only writer is the driver. When the pipe
closes, because the driver closed it after ``ray.shutdown`` or because the kernel
closed it when the driver died (SIGKILL included), the reaper SIGKILLs every
process whose environment carries the token, except the driver, until none is
left, then exits.

Run as a script (``python reaper.py TOKEN DRIVER_PID``); standard library only,
Linux (``/proc``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TOKEN_VAR = "GOLDEN_RUN_TOKEN"
_ROUNDS = 100
_PAUSE_S = 0.1


def tagged(token: str, *, exclude: set[int]) -> list[int]:
    """Pids of live processes whose environment holds ``GOLDEN_RUN_TOKEN=token``."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                env = handle.read()
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except OSError:  # gone, or not ours
            continue
        if state != b"Z" and needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def sweep(token: str, *, exclude: set[int]) -> list[int]:
    """SIGKILL every tagged process until a scan finds none; returns the pids killed."""
    killed: list[int] = []
    quiet = 0
    for _ in range(_ROUNDS):
        pids = tagged(token, exclude=exclude)
        if not pids:
            quiet += 1
            if quiet >= 3:  # three empty scans in a row: nothing is being started any more
                break
        else:
            quiet = 0
        for pid in pids:
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


def main(argv: list[str]) -> int:
    token, driver = argv[1], int(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe ends a reaper
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        while sys.stdin.buffer.read(65536):
            pass
    except OSError:
        pass
    killed = sweep(token, exclude={os.getpid(), driver})
    if killed:
        print(f"golden reaper: killed {len(killed)} process(es) of run {token}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
