"""The process Ray starts for a zygote worker (``harness.runner.zygote``): standard library only.

Run as ``python -S -E zygote_client.py default_worker.py ARGS...`` (the actor's
``runtime_env["py_executable"]``). It sends its command line, environment,
working directory, pid and stdin/stdout/stderr to the server named by
``$GOLDEN_ZYGOTE_SOCKET``, which forks the worker, then waits for that worker to
exit, forwarding SIGTERM and SIGINT to it. Without a reachable server it runs
the worker itself (``os.execv`` of this interpreter, site enabled): slower,
never different; except for a worker that must run a setup hook first
(``$GOLDEN_ZYGOTE_SETUP_HOOK``, which only the server runs): that one exits with
status 3 and says why, so the actor fails to start instead of running unmutated.
"""

import json
import os
import select
import signal
import socket
import sys

ADDRESS_VAR = "GOLDEN_ZYGOTE_SOCKET"
HOOK_VAR = "GOLDEN_ZYGOTE_SETUP_HOOK"  # harness.runner.zygote.HOOK_VAR


def _run_here() -> None:
    if os.environ.get(HOOK_VAR, "").strip():
        sys.stderr.write(f"zygote client: no zygote reachable at {os.environ.get(ADDRESS_VAR, '')!r}, and this "
                         f"worker must run the setup hook {os.environ[HOOK_VAR]} before it starts (only the "
                         "zygote runs it): not starting\n")
        sys.exit(3)
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])


def read_line(conn: socket.socket) -> dict:
    """One newline-terminated JSON reply from a zygote (EOFError if it closes first)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            raise EOFError("the zygote closed the connection")
        data += chunk
    return json.loads(data)


# Interpreter options Ray may put before the worker script (``ray._private.services._site_flags``:
# ``-s`` when the driver runs with ``-s``, ``-I`` or ``PYTHONNOUSERSITE``) that change nothing in a
# worker forked from the server, whose interpreter and ``sys.path`` are set up already.
FORKABLE_OPTIONS = ("-s", "-E", "-B", "-u")


def worker_argv(argv: list[str]) -> list[str] | None:
    """``argv`` (the command line after this client's own name: ``[options...] script args...``)
    as the server runs it: the script first, the options of :data:`FORKABLE_OPTIONS` dropped.
    None when another option comes first (``-S``, ``-X ...``): such a worker runs here, fresh."""
    out = list(argv)
    while out and out[0].startswith("-"):
        if out[0] not in FORKABLE_OPTIONS:
            return None
        out.pop(0)
    return out or None


def main() -> None:
    address = os.environ.get(ADDRESS_VAR, "")
    argv = worker_argv(sys.argv[1:])
    if not address or argv is None:
        _run_here()
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "client_pid": os.getpid()}
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(address)
        payload = json.dumps(request).encode() + b"\n"
        sent = socket.send_fds(conn, [payload], [0, 1, 2])  # a stream socket may take part of it
        conn.sendall(payload[sent:])
        child = int(read_line(conn)["pid"])
        conn.close()
    except (OSError, ValueError, EOFError, KeyError):
        _run_here()
        return
    try:
        pidfd = os.pidfd_open(child)
    except OSError:  # the worker is already gone
        sys.exit(1)

    def forward(signum, _frame) -> None:
        try:
            os.kill(child, signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    while True:
        try:
            ready, _, _ = select.select([pidfd], [], [])
        except InterruptedError:
            continue
        if ready:
            break
    sys.exit(0)


if __name__ == "__main__":
    main()
