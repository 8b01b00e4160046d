"""Counting a server's established TCP connections on this host (tests of side-group stores)."""

from __future__ import annotations

import time


def established(port: int) -> int:
    """Established TCP connections accepted by the server listening on ``port`` (from /proc/net/tcp{,6})."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    n += 1
    return n


def settles_to(port: int, want: int, within_s: float = 30.0) -> int:
    """Connection counts change when the peer's close reaches the server: poll until ``want`` (or give up)."""
    deadline = time.monotonic() + within_s
    while (got := established(port)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got
