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

:func:`lean_head_installed`, entered around the same ``ray.init``, leaves out two of the
head node's Python processes that a private one-node instance never uses: the autoscaler's
monitor (nothing autoscales a fixed local node; it also ignores SIGTERM, so ``ray.shutdown``
waited its full second on it every time) and, when no worker output goes to the driver
(``log_to_driver=False``), the log monitor that would publish it. About 1.1 s of CPU less at
every start on the 2-core box, and 1 s less at every shutdown. ``GOLDEN_LEAN_HEAD=0`` keeps
them; so does a ray whose ``Node`` does not take its parameters the way this expects (the
start is then Ray's own).

Imports ray inside the context managers only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

WORKER_EXEC_ENV = "GOLDEN_WORKER_EXEC"  # "0": workers start through Ray's own setup_worker.py
WORKER_EXEC = Path(__file__).resolve().with_name("worker_exec.py")
LEAN_HEAD_ENV = "GOLDEN_LEAN_HEAD"  # "0": the head node starts every process Ray starts by default


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


@contextlib.contextmanager
def lean_head_installed(log_to_driver: bool) -> Iterator[bool]:
    """Enter around a ``ray.init`` that starts a local instance; yields whether its head node
    leaves out the autoscaler monitor (and, unless ``log_to_driver``, the log monitor). Only a
    head node is changed, so joining a cluster is not; Ray's ``Node.__init__`` is put back on exit."""
    if os.environ.get(LEAN_HEAD_ENV, "1").strip() == "0":
        yield False
        return
    import inspect

    from ray._private import node, parameter

    if not {"no_monitor", "include_log_monitor"} <= set(inspect.signature(parameter.RayParams).parameters):
        yield False
        return
    original = node.Node.__init__

    def lean_init(self, ray_params, *args, **kwargs):
        head = kwargs.get("head", args[0] if args else False)
        if head:
            ray_params.no_monitor = True
            if not log_to_driver and ray_params.include_log_monitor is None:
                ray_params.include_log_monitor = False  # Node fills in True only where it is None
        original(self, ray_params, *args, **kwargs)

    node.Node.__init__ = lean_init
    try:
        yield True
    finally:
        node.Node.__init__ = original


@contextlib.contextmanager
def driver_harness_first() -> Iterator[bool]:
    """Enter around any ``ray.init``; yields whether it moved the working directory.

    Ray puts the driver's working directory in front of every worker's ``sys.path`` (its
    ``py_driver_sys_path``), so a worker that imports ``harness`` itself (one started as a
    fresh interpreter: ``GOLDEN_ZYGOTE=0``, a cluster node) would import a ``harness/`` folder
    there instead of the driver's package. When the working directory holds one that is not
    the imported package, ``ray.init`` runs from the package's parent folder, which is then the
    entry Ray ships: the workers import the driver's harness (``harness.code_identity`` checks
    it in each). The working directory is put back on exit; a local instance's workers start in
    that folder then, so the run passes them absolute paths only."""
    from pathlib import Path

    from harness.code_identity import package_root

    cwd = Path.cwd()
    shadow = cwd / "harness"
    ours = package_root()
    if not os.path.lexists(shadow) or shadow.resolve() == ours:
        yield False
        return
    os.chdir(ours.parent)
    try:
        yield True
    finally:
        os.chdir(cwd)


@contextlib.contextmanager
def local_start(log_to_driver: bool) -> Iterator[None]:
    """This module's changes, around a ``ray.init`` that starts a local instance."""
    with worker_exec_installed(), lean_head_installed(log_to_driver), driver_harness_first():
        yield
