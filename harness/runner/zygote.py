"""A fork server for Ray worker processes: torch and the harness's worker modules imported once.

A Ray worker of a warm runtime normally starts as ``python default_worker.py ...``
(through the raylet's setup script, ``harness.runner.worker_exec``) and then
imports torch and the harness: about 1 s of CPU per process, paid by every
policy rank and rollout actor (the flagship has nine). With a zygote, such a
worker's ``runtime_env`` carries ``py_executable`` = :func:`worker_command`: Ray
starts ``zygote_client.py`` (standard library only, no ``site``) in place of
the interpreter; the client hands its command line, environment, working
directory, pid and standard file descriptors to this server over a Unix socket,
and the server forks a child that becomes the worker:

* the child restores SIGCHLD (the one handler the server changes), takes the
  client's stdin/stdout/stderr (``dup2``), working directory and whole
  environment (``os.environ`` replaced; the socket variable dropped), draws
  fresh seeds for Python's ``random`` and numpy's global generator (as a new
  interpreter does), sets ``sys.argv`` and ``sys.path`` as a fresh worker has
  them, and runs ``default_worker.py`` as ``__main__``: Ray is imported there,
  in the child, so its C++ core starts in the child as in a fresh process. The
  worker registers with the raylet under the child's pid;
* the child dies with its client (a thread waits on the client's pidfd), and
  the client exits when the child does (it waits on the child's pidfd,
  forwarding SIGTERM/SIGINT), so Ray's view of "the process it started" holds
  both ways;
* the server is single-threaded, imports :data:`PRELOAD` and never ray, reaps
  its children, exits with its parent (``PR_SET_PDEATHSIG``) and on
  :meth:`Zygote.close`; it carries the runtime's reaper token
  (``harness.runner.reaper``) in its environment, and so does every child's
  ``/proc`` environment.

What a forked worker shares with a fresh one: what a workload can see. The
preloads are modules a worker imports anyway before any workload code runs,
imported under the start-up environment of a pool process (``BASE_ENV`` of
``harness.runner.warm`` over the driver's; ``OMP_NUM_THREADS=1`` before
torch's OpenMP runtime loads); nothing in them reads a workload's variables at
import, and ``harness.runner.warm.zygote_runtime_env`` forks only workers whose
start-up variables are the runner's own. torch's default generator is
untouched by the server (a fresh process's fixed seed). What differs: the
Python hash seed is the server's (no surface depends on string hash order: a
cold run's ranks each draw their own), the preloads' module-level
timestamps are the server's start, and the preloads' objects are in the cyclic
collector's permanent generation (``process_state.freeze_heap``, after the
preloads; a flavour freezes its own too), so a child's collections never scan them.
``suites/integration/test_zygote.py`` compares a forked worker with a fresh one.

Flavours (:data:`FLAVOURS`): on a driver's request (:meth:`Zygote.flavour`)
the server forks a child that listens on a socket of its own, answers, then
also imports what every rank of one policy backend imports at start-up (in a
fresh rank's order) and serves as the server does; it dies with the server.
Workers of other kinds never fork from it.

If the client cannot reach a server it runs the worker itself
(``os.execv`` of the interpreter): slower, never different.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness.registry.policy import POLICY_BACKENDS
from harness.runner.process_state import freeze_heap
from harness.runner.zygote_client import read_line

ADDRESS_VAR = "GOLDEN_ZYGOTE_SOCKET"  # the client reads the server's socket path here
# A worker setup hook (``module.function``) the child runs before the worker script, where Ray
# runs a job's ``worker_process_setup_hook`` in a fresh worker: before any actor class is loaded
# (``warm.zygote_runtime_env`` sets it for a fresh actor of a run that carries a hook). Like
# ADDRESS_VAR it is not in the worker's environment.
HOOK_VAR = "GOLDEN_ZYGOTE_SETUP_HOOK"
# Imported once, at the server's start. Never ray: Ray's C++ core keeps per-process state from the
# moment its library loads (the job id it was started for, the seed of the generator behind its
# random object ids), so every child of a server that loaded it would share it. The server exits
# if a preload pulls ray in; its clients then start their workers as fresh interpreters.
# ``torch._inductor.config``: what ``torch.use_deterministic_algorithms`` imports (it pulls in
# dynamo, ~1.2 s of CPU), called by every worker's start-up before workload code (the policy
# ranks' init_distributed, the rollout engine's configure_determinism, a warm host's baseline
# restore). ``numpy.random``: imported by the child's reseed anyway. The third-party modules at
# the end are what ``import ray`` imports in every worker (not ray's own: requests, jsonschema,
# protobuf, ...; about a third of the child's ray import).
PRELOAD = ("torch", "torch.distributed", "torch._inductor.config", "numpy", "numpy.random",
           "harness.policy.distributed", "harness.policy.native.engine", "harness.rollout.worker",
           "harness.rollout.engine_worker", "harness.runner.process_state", "harness.spec.typed",
           "harness.parallel.settle", "harness.refit.zmq_stream", "harness.profiler.trace",
           "requests", "jsonschema", "google.protobuf", "filelock", "packaging.version", "msgpack", "yaml")
# Flavours: a server forked from this one (it inherits PRELOAD) that also imports what every
# rank of one policy backend imports at start-up, whatever the workload, in the order a fresh
# rank does: ``init_distributed`` imports the above (``use_deterministic_algorithms``), then
# installs ``harness.parallel.settle`` (it rebinds torch.distributed functions, so a module that
# binds one at import must come after it, as in a fresh rank), then ``create_engine`` imports
# the engine module and the engine's ``__init__`` megatron-core (``compat.import_megatron``: what
# the CPU layer imports before it patches). For the fresh (not pooled) ranks of the megatron and
# dtensor backends; every other worker forks from the plain server. An entry "module:function"
# imports the module and calls the function (no arguments). Declared by each backend's record
# (``harness.registry.policy``: ``flavour``), read here: {policy.backend: imports}.
def _flavours(backends: dict = POLICY_BACKENDS) -> dict[str, tuple[str, ...]]:
    """{policy.backend: its record's ``flavour``} for every backend that declares one."""
    return {name: b.flavour for name, b in backends.items() if b.flavour}


FLAVOURS: dict[str, tuple[str, ...]] = _flavours()
READY_TIMEOUT_S = 120.0
CLIENT = Path(__file__).with_name("zygote_client.py")


def worker_command() -> str:
    """The ``runtime_env["py_executable"]`` that starts a Ray worker through the zygote."""
    return f"{sys.executable} -S -E {CLIENT}"


class Zygote:
    """One fork server process (see the module docstring); ``close`` ends it and its flavours."""

    def __init__(self, env: dict[str, str]) -> None:
        self._dir = tempfile.mkdtemp(prefix="golden-zygote-")
        self.address = os.path.join(self._dir, "s")
        ready = os.path.join(self._dir, "ready")
        from harness import code_identity

        # -P: the working directory is not put on sys.path, so a harness/ folder there is never imported
        # (code_identity checks it); the server and every worker forked from it run the driver's harness
        self.proc = subprocess.Popen([sys.executable, code_identity.SAFE_PATH_FLAG, "-m", "harness.runner.zygote",
                                      self.address, ready], env={**env, **code_identity.exported()},
                                     stdin=subprocess.DEVNULL, start_new_session=False)
        self._ready = ready
        self._flavours: dict[str, tuple[str, int] | None] = {}  # name -> (address, pid); None: it failed
        self._flavour_lock = threading.Lock()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Whether the server imported its preloads and listens (False: it died or timed out)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self._ready):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def flavour(self, name: str, timeout: float = READY_TIMEOUT_S) -> str | None:
        """The socket of flavour ``name`` (:data:`FLAVOURS`), started on first use: a child of
        this server that also imports the flavour's modules; its clients queue while it does.
        None when there is no such flavour or it could not be started (the caller then uses
        :attr:`address`); a flavour that dies later makes its clients start fresh interpreters."""
        if name not in FLAVOURS or not self.alive():
            return None
        with self._flavour_lock:
            if name not in self._flavours:
                self._flavours[name] = self._start_flavour(name, timeout)
            started = self._flavours[name]
        return started[0] if started is not None and _running(started[1]) else None

    def _start_flavour(self, name: str, timeout: float) -> tuple[str, int] | None:
        address = os.path.join(self._dir, f"s-{name}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(timeout)  # the server answers once its own preloads are in
                conn.connect(self.address)
                conn.sendall(json.dumps({"flavour": name, "address": address}).encode() + b"\n")
                reply = read_line(conn)
            return address, int(reply["pid"])
        except (OSError, ValueError, KeyError, EOFError):
            return None

    def flavour_pids(self) -> dict[str, int]:
        """The pid of every flavour server started so far (tests, diagnostics)."""
        return {k: v[1] for k, v in self._flavours.items() if v is not None}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # its flavours die with it (PR_SET_PDEATHSIG)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for name in ("s", "ready", *(f"s-{f}" for f in self._flavours)):
            try:
                os.unlink(os.path.join(self._dir, name))
            except OSError:
                pass
        try:
            os.rmdir(self._dir)
        except OSError:
            pass


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data = b""
    fds: list[int] = []
    while not data.endswith(b"\n"):
        chunk, got, _flags, _addr = socket.recv_fds(conn, 1 << 20, 8)
        if not chunk:
            raise EOFError("client closed the connection before its request")
        data += chunk
        fds.extend(got)
    return json.loads(data), fds


def _watch_client(pid: int) -> None:
    """In the child: die when the client (the process Ray started) is gone."""
    import select
    import threading

    try:
        fd = os.pidfd_open(pid)
    except OSError:  # already gone
        os.kill(os.getpid(), signal.SIGKILL)
        return

    def wait() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="zygote-client-watch", daemon=True).start()


# sys.path as the interpreter built it, without the server's own first entry (``-m``: its working
# directory); set in serve() before any preload, so a child can rebuild a fresh worker's sys.path.
_BASE_PATH: list[str] = []
_SERVER_ENTRY: list[str] = []  # that first entry


def _worker_sys_path(script: str, loaded: list[str]) -> list[str]:
    """The ``sys.path`` a fresh ``python script`` has once it imported the preloads: the server's
    own as its preloads left it (``loaded``), with the server's first entry (``-m``: its working
    directory) replaced by the script's folder, so entries a preload put in front stay in front and
    entries it appended (setuptools appends its ``_vendor`` folder) stay at the end."""
    out = list(loaded)
    entry = _SERVER_ENTRY[0] if _SERVER_ENTRY else None
    if entry is not None and entry in out:
        out[out.index(entry)] = os.path.dirname(script)
    else:
        out.insert(0, os.path.dirname(script))
    return out


def _reseed() -> None:
    """Draw the seeds a fresh interpreter draws at start-up: Python's ``random`` and numpy's global
    generator from the OS (every child would otherwise continue the server's one state). torch's
    default generator starts from its fixed seed in a fresh process; the server never draws from it."""
    import random

    random.seed()
    import numpy as np

    np.random.seed()


def _become_worker(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: take the client's process identity and run the worker script."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the only handler the server changed
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({k: v for k, v in request["env"].items() if k not in (ADDRESS_VAR, HOOK_VAR)})
    conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    conn.close()
    _watch_client(int(request["client_pid"]))
    _reseed()
    argv = list(request["argv"])
    script = os.path.abspath(argv[0])
    sys.argv = [script, *argv[1:]]
    sys.path[:] = _worker_sys_path(script, list(sys.path))
    import runpy

    code = 0
    hook = (request["env"].get(HOOK_VAR) or "").strip()
    try:
        if hook:
            from harness.runner.process_state import run_setup_hook

            run_setup_hook(hook)
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the worker's own failure: report it as a fresh process would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


def import_preloads(names: tuple[str, ...]) -> None:
    """Import each of ``names`` in order ("module", or "module:function": then call it)."""
    import importlib

    for name in names:
        module, _, function = name.partition(":")
        loaded = importlib.import_module(module)
        if function:
            getattr(loaded, function)()


def _preload(names: tuple[str, ...]) -> None:
    """:func:`import_preloads` in a server; exit if ray came in."""
    import_preloads(names)
    if "ray" in sys.modules:
        raise SystemExit("harness.runner.zygote: a preload imported ray; not serving")


def _listen(address: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(128)  # clients queue here while the preloads import
    return server


def _start_flavour(server: socket.socket, conn: socket.socket, request: dict, parent: int) -> None:
    """In a forked child of the server ``parent``: become the server of flavour ``request["flavour"]``:
    listen on ``request["address"]``, answer the driver (its clients may connect from now on),
    import the flavour's modules, serve. Dies with the server that forked it."""
    name = request["flavour"]
    _die_with_parent()
    if os.getppid() != parent:  # the server died before the death signal was set
        os._exit(1)
    server.close()
    own = _listen(request["address"])
    conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    conn.close()
    import warnings

    try:
        with warnings.catch_warnings():  # import-time notices (megatron-core's "Apex is not installed"):
            warnings.simplefilter("ignore")  # a fresh rank writes them to its own log, not the driver's
            _preload(FLAVOURS[name])
        freeze_heap()
    except BaseException as exc:  # noqa: BLE001 - its queued clients see the socket close and run fresh
        print(f"harness.runner.zygote: flavour {name} not serving: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(1)
    _serve_loop(own)


def _serve_loop(server: socket.socket) -> None:
    while True:
        conn, _ = server.accept()
        try:
            request, fds = _recv_request(conn)
        except (OSError, ValueError, EOFError):
            conn.close()
            continue
        flavour = request.get("flavour")
        if flavour is not None and (flavour not in FLAVOURS or fds or not isinstance(request.get("address"), str)):
            for fd in fds:
                os.close(fd)
            conn.close()  # not a request this server serves: the caller sees EOF
            continue
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                if flavour is not None:
                    _start_flavour(server, conn, request, parent)
                else:
                    server.close()
                    _become_worker(conn, request, fds)
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        conn.close()


def serve(address: str, ready: str) -> None:
    """The server loop (``python -m harness.runner.zygote ADDRESS READY_FILE``)."""
    from harness import code_identity
    from harness.footprint import recorder

    recorder.install()  # its children inherit what it preloads, and the hook (harness.footprint)
    code_identity.check_process("the zygote (fork server)")
    entry = [] if sys.flags.safe_path else sys.path[:1]  # -P (how Zygote starts it): no working-directory entry
    _SERVER_ENTRY[:], _BASE_PATH[:] = entry, sys.path[len(entry):]
    _die_with_parent()
    server = _listen(address)
    _preload(PRELOAD)
    freeze_heap()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    Path(ready).write_text(str(os.getpid()))
    _serve_loop(server)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
