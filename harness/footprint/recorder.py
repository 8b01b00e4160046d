"""Record what one process of a run reads: module files, opened files, listed directories.

Contract (stdlib only, called from worker start-up code):

* ``install()`` adds one ``sys.addaudithook`` (idempotent). From then on every ``open``
  event (``open``, ``io.open_code`` of the import system, ``os.open``) with a path, and
  every ``os.listdir`` / ``os.scandir`` of a directory, is remembered once. A process forked
  after ``install`` (a zygote's child, an engine fork server's child) inherits the hook and
  everything remembered so far: the modules a zygote preloaded count for its children.
* ``bind(run_dir=None)`` names the run the process now works for (default:
  ``$HARNESS_TRACE_DIR``, which every process of a run carries). It opens
  ``RUN_DIR/footprint/<pid>-<n>.paths`` and writes every file of ``sys.modules``, then
  everything remembered; each later new path is appended at once (``os.write`` of one
  line), so the file is complete up to the moment the process stopped, even after SIGKILL.
  The hook rebinds by itself when ``$HARNESS_TRACE_DIR`` changes (a warm process adopted by
  the next workload), and ``bind()`` at each workload's start covers a process that opens
  nothing new. A process that a warm pool hands to several workloads writes, for each, all
  it ever read: a superset, never less.
* Lines: ``P <python version> <sys.prefix>`` first, then ``F <path>`` a file (opened, or a
  module's ``__file__``), ``D <path>`` a listed
  directory. Paths are absolute, as the process saw them.
* ``GOLDEN_FOOTPRINT=0`` turns recording off (the golden then stores no footprint and is
  always selected).

Nothing here changes what a process computes: it writes only under ``RUN_DIR/footprint/``,
which no surface reads.
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["DIR", "ENABLE_VAR", "bind", "enabled", "install"]

DIR = "footprint"
ENABLE_VAR = "GOLDEN_FOOTPRINT"
_TRACE_VAR = "HARNESS_TRACE_DIR"

_seen: dict[str, str] = {}  # path -> kind ("F" file, "D" directory), in first-seen order
_state = {"installed": False, "run": None, "fd": -1, "pid": -1, "count": 0}
_busy = threading.local()
_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get(ENABLE_VAR, "1") != "0"


def install() -> None:
    """Add the audit hook once per process (forked children inherit it)."""
    if _state["installed"] or not enabled():
        return
    _state["installed"] = True
    _remember_modules()
    sys.addaudithook(_hook)


def bind(run_dir: str | os.PathLike | None = None) -> None:
    """Write this process's footprint for the run at ``run_dir`` (default ``$HARNESS_TRACE_DIR``)."""
    if not enabled():
        return
    install()
    target = os.fspath(run_dir) if run_dir is not None else os.environ.get(_TRACE_VAR)
    if target and (target != _state["run"] or _state["pid"] != os.getpid()):
        with _lock:
            _open_record(target)


def _remember_modules() -> None:
    """Every module's file, every package's folders and every ``sys.path`` folder (the import
    system listed them, maybe before the hook was there): what a process imported counts,
    however it got there."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path not in _seen:
            _seen[path] = "F"
        folders = getattr(module, "__path__", None)
        if folders is not None and not isinstance(folders, str):
            try:
                for folder in list(folders):
                    if isinstance(folder, str) and folder not in _seen:
                        _seen[folder] = "D"
            except Exception:  # noqa: BLE001 - a namespace path that cannot be listed: its modules still count
                pass
    for folder in [*sys.path, *list(sys.path_importer_cache)]:  # every folder the import system searches
        if isinstance(folder, str) and folder and folder not in _seen and os.path.isdir(folder):
            _seen[folder] = "D"


def _hook(event: str, args: tuple) -> None:
    if event == "open":
        kind = "F"
    elif event in ("os.listdir", "os.scandir"):
        kind = "D"
    else:
        return
    if getattr(_busy, "on", False) or not args:
        return
    path = args[0]
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str) or not path:
        return  # a file descriptor, or the working directory's listing ("." is recorded absolute below)
    _busy.on = True
    try:
        if not os.path.isabs(path):
            path = os.path.join(os.getcwd(), path)
        new = path not in _seen
        target = os.environ.get(_TRACE_VAR)
        moved = bool(target) and (os.getpid() != _state["pid"] or target != _state["run"])
        if not new and not moved:
            return
        if new and _from_code_digest():
            return
        if new:
            _seen[path] = kind
        with _lock:
            if moved:
                _open_record(target)  # everything seen, this path included
            elif _state["fd"] >= 0 and _state["pid"] == os.getpid():
                os.write(_state["fd"], f"{kind} {path}\n".encode("utf-8", "surrogateescape"))
    except Exception:  # noqa: BLE001 - an audit hook must never break the process; the footprint then lacks a line
        pass
    finally:
        _busy.on = False


def _from_code_digest() -> bool:
    """True for the reads of ``harness.code_identity.digest`` (it hashes every harness file to
    compare processes; that is not the code a process runs)."""
    try:
        frame = sys._getframe(2)  # 0: here, 1: the hook, 2: the code that opened
    except ValueError:
        return False
    for _ in range(8):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == "digest" and code.co_filename.endswith("code_identity.py"):
            return True
        frame = frame.f_back
    return False


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a lock another thread held at the fork would never be released in the child


os.register_at_fork(after_in_child=_after_fork)


def _open_record(run_dir: str) -> None:
    """Start this process's record for ``run_dir``: every module file and remembered path."""
    prev = getattr(_busy, "on", False)
    _busy.on = True
    try:
        if _state["fd"] >= 0 and _state["pid"] == os.getpid():
            try:
                os.close(_state["fd"])
            except OSError:
                pass
        folder = os.path.join(run_dir, DIR)
        os.makedirs(folder, exist_ok=True)
        _state["count"] = _state["count"] + 1 if _state["pid"] == os.getpid() else 1
        name = os.path.join(folder, f"{os.getpid()}-{_state['count']}.paths")
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _state.update(run=run_dir, fd=fd, pid=os.getpid())
        _remember_modules()
        head = f"P {sys.version.split()[0]} {sys.prefix}\n"
        lines = head + "".join(f"{kind} {path}\n" for path, kind in list(_seen.items()))
        os.write(fd, lines.encode("utf-8", "surrogateescape"))
    finally:
        _busy.on = prev
