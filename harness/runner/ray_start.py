"""How the harness's local Ray instances start their Python workers (``harness.runner.worker_exec``).

The raylet launches every Python worker through a setup script, Ray's own
``setup_worker.py`` unless told otherwise; while :func:`worker_exec_installed` is
entered around ``ray.init``, the instance that ``ray.init`` starts names
``harness/runner/worker_exec.py`` instead (the script path is read once, when the
node is built, from ``ray._private.ray_constants.SETUP_WORKER_FILENAME``, an absolute
path there replacing Ray's file). That script starts the same worker with the same
command and environment without importing ray first. ``GOLDEN_WORKER_EXEC=0``
keeps Ray's script; so does a ray without that constant. Joining an existing
cluster changes nothing (its raylets were started elsewhere).

Imports ray inside :func:`worker_exec_installed` only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

WORKER_EXEC_ENV = "GOLDEN_WORKER_EXEC"  # "0": workers start through Ray's own setup_worker.py
WORKER_EXEC = Path(__file__).resolve().with_name("worker_exec.py")


@contextlib.contextmanager
def worker_exec_installed() -> Iterator[bool]:
    """Enter around a ``ray.init`` that starts a local instance; yields whether its workers will
    start through ``worker_exec.py``. Ray's constant is put back on exit."""
    if os.environ.get(WORKER_EXEC_ENV, "1").strip() == "0":
        yield False
        return
    from ray._private import ray_constants

    old = getattr(ray_constants, "SETUP_WORKER_FILENAME", None)
    if old is None:
        yield False
        return
    ray_constants.SETUP_WORKER_FILENAME = str(WORKER_EXEC)
    try:
        yield True
    finally:
        ray_constants.SETUP_WORKER_FILENAME = old
