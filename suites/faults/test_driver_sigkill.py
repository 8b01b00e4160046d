"""A SIGKILLed driver leaves no process of its run behind (issue 16).

A real `golden run` of the smoke workload is started; once its policy and rollout
workers are up, the driver (only the driver, not its process group) gets SIGKILL.
Before this, Ray's dashboard and runtime-env agents of the run stayed alive after
the driver died. Every process that was part of the run at the kill (the driver's
process tree) must be gone when the run's reaper exits (it exits once a sweep
finds nothing left), and no process carrying the run's token may be left.
Timing decides nothing: the guards only stop a hung start-up or reaper.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STARTUP_GUARD_S = 600   # a guard against a hung start-up, never a verdict
CLEANUP_GUARD_S = 180


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    ppid = int(handle.read().rsplit(b")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def descendants(root: int) -> list[int]:
    kids, out, stack = _children(), [], [root]
    while stack:
        for child in kids.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_the_driver_leaves_no_process_of_the_run(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    driver = subprocess.Popen([sys.executable, "-m", "harness", "run", "qwen3_moe_tiny_smoke",
                               "--run-dir", str(tmp_path / "run")], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run_processes: dict[int, str] = {}
    try:
        started = time.monotonic()
        log = []
        for line in driver.stderr:  # progress lines: wait until every worker is up
            log.append(line)
            if "rollout engine(s)" in line:
                break
            assert time.monotonic() - started < STARTUP_GUARD_S, "".join(log)
        else:
            pytest.fail("the run ended before its workers started:\n" + "".join(log))
        # the rollout actor is being created: wait until the driver's tree stops growing
        previous = -1
        while True:
            tree = [p for p in descendants(driver.pid) if alive(p)]
            if len(tree) == previous:
                break
            previous = len(tree)
            time.sleep(2)
        run_processes = {p: cmdline(p) for p in tree}
        reapers = {p: cmd.split() for p, cmd in run_processes.items() if "reaper.py" in cmd}
        assert any("raylet" in cmd for cmd in run_processes.values()), run_processes
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        # the verdict is taken when the run's reaper has exited (it exits once its sweep found
        # nothing left); without a reaper, right after the driver died
        deadline = time.monotonic() + CLEANUP_GUARD_S
        while any(alive(p) for p in reapers):
            assert time.monotonic() < deadline, f"the reaper did not finish: {reapers}"
            time.sleep(0.2)
        left = {p: cmd for p, cmd in run_processes.items() if alive(p)}
        assert not left, f"alive after the driver's SIGKILL: {left}"
        assert reapers, "the run had no reaper"
        from harness.runner.reaper import tagged

        token = next(iter(reapers.values()))[2]  # python reaper.py TOKEN DRIVER_PID
        assert tagged(token, exclude={os.getpid()}) == []  # nor any process started after the snapshot
    finally:
        for pid in [driver.pid, *run_processes]:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
