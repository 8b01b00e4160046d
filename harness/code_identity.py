"""Which harness a process runs: the driver's, file for file (issue 41 item 5).

A run's manifest records the driver's harness version and commit, so every process of the
run must execute that same code. A worker that imported another ``harness/`` (a tree in the
working directory, which ``python -m`` and ``python -c`` put first on ``sys.path``; a node of a
cluster with another checkout; a worker environment built from elsewhere) would produce
results the record does not describe.

Contract:
* ``digest()`` is the sha256 over every ``*.py`` file of the imported ``harness`` package
  (relative path and sha256 of its bytes, sorted by path): two processes with equal digests
  run the same harness source, wherever it is installed. Computed once per process (~10 ms).
* The driver exports it (``worker_env``: ``HARNESS_CODE_DIGEST`` and, for the message,
  ``HARNESS_CODE_ROOT``); ``check_process(where)``, called as each process starts (the fork
  server, every rank and engine process, the canary), raises ``CodeMismatch`` naming this
  process, the package folder it imported and the driver's, and both digests. A process
  without the variable (not started by a run) is not checked.
* Processes the harness starts with ``python -m harness...`` are started with ``-P`` (no
  working directory on ``sys.path``: ``SAFE_PATH_FLAG``), so they import the installed
  harness in the first place; the check is what proves it.

Stdlib only.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

__all__ = ["DIGEST_VAR", "ROOT_VAR", "SAFE_PATH_FLAG", "CodeMismatch", "check_process", "digest", "package_root",
           "exported"]

DIGEST_VAR = "HARNESS_CODE_DIGEST"
ROOT_VAR = "HARNESS_CODE_ROOT"
SAFE_PATH_FLAG = "-P"  # Python >= 3.11: never prepend the working directory / script folder to sys.path


class CodeMismatch(RuntimeError):
    """A process of a run imported another harness than the driver's."""


def package_root() -> Path:
    """The folder of the ``harness`` package this process imported."""
    import harness

    return Path(harness.__file__).resolve().parent


@cache
def digest() -> str:
    """sha256 over (relative path, sha256) of every ``*.py`` file of the imported package."""
    root = package_root()
    listing = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        listing.update(path.relative_to(root).as_posix().encode("utf-8", "surrogateescape") + b"\0")
        listing.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return listing.hexdigest()


def exported() -> dict[str, str]:
    """The variables a driver gives every process of its run."""
    return {DIGEST_VAR: digest(), ROOT_VAR: str(package_root())}


def check_process(where: str) -> None:
    """Refuse (``CodeMismatch``) a process started by a run whose harness is not the driver's."""
    wanted = os.environ.get(DIGEST_VAR)
    if not wanted:
        return
    have = digest()
    if have == wanted:
        return
    driver = os.environ.get(ROOT_VAR, "?")
    raise CodeMismatch(
        f"{where} (pid {os.getpid()}) imported the harness at {package_root()} (sha256 {have[:12]} over its *.py "
        f"files), not the driver's at {driver} (sha256 {wanted[:12]}): its results would come from other code than "
        "the run records. Start the run where both import the same harness (a 'harness/' folder in the working "
        "directory, another checkout on a cluster node, or a worker environment built from another tree)")
