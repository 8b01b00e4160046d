"""The warm runtime's fork server (``harness.runner.zygote``) with a real Ray instance.

One ``WarmRuntime`` (Ray up, zygote started), then actors created with
``zygote_runtime_env``:

* each is a child of the zygote (forked, not a fresh interpreter), has its own
  pid, runs Ray's ``default_worker.py`` as ``__main__`` with the ``sys.argv``
  and ``sys.path`` of a fresh worker (and its signal handlers, torch thread
  counts and working directory), and sees exactly the environment Ray gave its
  client: the actor's ``env_vars``, none of the zygote's own start-up variables
  (``ZYGOTE_PROBE``), and not the socket variable;
* ``ray.kill`` leaves neither the worker nor its client (the process Ray
  started, which waits for it) behind, and the other worker runs on;
* an actor whose ``env_vars`` name a variable outside ``ZYGOTE_START_VARS`` (a
  workload's ``plugins.env``) is not forked (a fresh interpreter);
* with a worker setup hook set, a forked actor has run it before its worker started
  (``zygote.HOOK_VAR``, not in its environment), one that cannot be forked is refused
  (it would start without the hook), and a pool process's ``runtime_env`` carries none;
* a flavour (``zygote.FLAVOURS``: megatron) is a child of the zygote, started on first use;
  a worker asking for it is that flavour's child, has megatron-core imported and the
  ``harness.parallel.settle`` wrappers installed (what a fresh rank has after its start-up),
  and otherwise the ``sys.argv``, ``sys.path``, signal handlers, thread counts and cwd of a
  fresh worker; an unknown flavour gets the plain zygote;
* with ``GOLDEN_ZYGOTE=0`` the runtime starts no zygote and nothing is forked.

A Ray worker's start-up is Ray's own; nothing here is a test double.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import ray

from harness.runner import warm
from harness.runner.warm import WarmRuntime, zygote_runtime_env
from harness.runner.zygote import ADDRESS_VAR, FLAVOURS, HOOK_VAR

pytestmark = pytest.mark.slow


@ray.remote
class Probe:
    def info(self, preload: tuple[str, ...] = ()) -> dict:
        """What a workload could see of this process; ``preload``: import these first, as a rank's
        start-up does (``zygote.import_preloads``), to compare a fresh worker with a flavour's."""
        import gc
        import signal

        import torch

        from harness.runner.zygote import import_preloads

        import_preloads(preload)

        def _handler(h) -> str:
            return getattr(h, "__qualname__", None) or repr(h)  # a function by name, not by address

        main = sys.modules["__main__"]
        return {"pid": os.getpid(), "ppid": os.getppid(), "env": dict(os.environ), "argv0": sys.argv[0],
                "path": list(sys.path), "main": getattr(main, "__file__", None),
                "signals": {s.name: _handler(signal.getsignal(s))
                            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD, signal.SIGHUP)},
                "threads": (torch.get_num_threads(), torch.get_num_interop_threads()), "cwd": os.getcwd(),
                "megatron": "megatron.core" in sys.modules,
                "patched": len(getattr(sys.modules.get("harness.mutations"), "_applied", ())),
                "settled": bool(getattr(torch.distributed.all_gather, "__harness_settled__", False)),
                "frozen": gc.get_freeze_count()}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _clients(address: str) -> set[int]:
    """Live zygote clients of this zygote (the processes Ray started: their environment names it)."""
    mark = f"{ADDRESS_VAR}={address}".encode()
    return {int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and _alive(int(e.name))
            and b"zygote_client.py" in _read(f"/proc/{e.name}/cmdline")
            and mark in _read(f"/proc/{e.name}/environ").split(b"\0")}


def test_workers_fork_from_the_zygote_with_their_own_environment(monkeypatch):
    runtime = WarmRuntime()
    try:
        monkeypatch.setenv(warm.ZYGOTE_ENV, "0")
        runtime.ensure_ray()  # Ray (raylet, and so every worker's environment) without the probe
        monkeypatch.delenv(warm.ZYGOTE_ENV)
        monkeypatch.setenv("ZYGOTE_PROBE", "server")  # in the zygote's start-up environment only
        runtime._start_zygote()
        zygote = runtime._zygote
        assert zygote is not None and zygote.wait_ready(), "the zygote did not start"
        monkeypatch.delenv("ZYGOTE_PROBE")
        env = {"OMP_NUM_THREADS": "1", "HARNESS_RUN_ID": "probe-run"}
        runtime_env = zygote_runtime_env({"env_vars": env})
        assert "py_executable" in runtime_env
        a, b = (Probe.options(num_cpus=0, runtime_env=runtime_env).remote() for _ in range(2))
        infos = ray.get([a.info.remote(), b.info.remote()], timeout=120)
        for info in infos:
            assert info["ppid"] == zygote.proc.pid, "the worker is not a child of the zygote"
            assert info["env"]["HARNESS_RUN_ID"] == "probe-run"
            assert "ZYGOTE_PROBE" not in info["env"] and ADDRESS_VAR not in info["env"]
            assert info["argv0"].endswith("default_worker.py") and info["main"] == info["argv0"]
        assert infos[0]["pid"] != infos[1]["pid"]
        assert b"ZYGOTE_PROBE=server" in _read(f"/proc/{infos[0]['pid']}/environ")  # forked: the server's
        clients = _clients(zygote.address)
        assert len(clients) == 2, clients  # one per worker
        ray.kill(a)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (_alive(infos[0]["pid"]) or len(_clients(zygote.address)) > 1):
            time.sleep(0.2)
        assert not _alive(infos[0]["pid"]), "the killed worker is still running"
        assert len(_clients(zygote.address)) == 1, "the killed worker's client is still running"
        assert _alive(infos[1]["pid"])

        plugin_env = zygote_runtime_env({"env_vars": {**env, "TORCH_SHOW_CPP_STACKTRACES": "1"}})
        assert "py_executable" not in plugin_env  # such a worker starts as a fresh interpreter
        fresh = ray.get(Probe.options(num_cpus=0, runtime_env=plugin_env).remote().info.remote(), timeout=120)
        assert fresh["ppid"] != zygote.proc.pid
        assert infos[1]["path"] == fresh["path"], "a forked worker's sys.path differs from a fresh one's"
        for key in ("argv0", "signals", "threads", "cwd"):
            assert infos[1][key] == fresh[key], f"a forked worker's {key} differs from a fresh one's"
        assert infos[1]["patched"] == 0
        # the zygote froze its preloads (process_state.freeze_heap): its children never scan them
        assert infos[1]["frozen"] > 100_000 and fresh["frozen"] == 0, (infos[1]["frozen"], fresh["frozen"])

        # a run with a setup hook: a fresh actor forked from the zygote runs it before its worker
        # starts; one that cannot be forked would not, so it is refused; pool processes never get it
        monkeypatch.setenv(warm.HOOK_VAR, "harness.mutations.extra_operator")
        hooked_env = zygote_runtime_env({"env_vars": env})
        assert hooked_env["env_vars"][HOOK_VAR] == "harness.mutations.extra_operator"
        hooked = ray.get(Probe.options(num_cpus=0, runtime_env=hooked_env).remote().info.remote(), timeout=120)
        assert hooked["ppid"] == zygote.proc.pid and hooked["patched"] == 1, hooked["patched"]
        assert HOOK_VAR not in hooked["env"] and warm.HOOK_VAR not in hooked["env"]
        with pytest.raises(RuntimeError, match="without the setup hook"):
            zygote_runtime_env({"env_vars": {**env, "TORCH_SHOW_CPP_STACKTRACES": "1"}})
        assert HOOK_VAR not in warm._pool_runtime_env()["env_vars"]
    finally:
        runtime.close()
    assert warm._current is None and runtime._zygote is None
    assert not _alive(zygote.proc.pid)


def test_a_flavour_forks_workers_with_its_backend_imported():
    runtime = WarmRuntime()
    try:
        runtime.ensure_ray()
        zygote = runtime._zygote
        assert zygote is not None and zygote.wait_ready(), "the zygote did not start"
        env = {"OMP_NUM_THREADS": "1", "HARNESS_RUN_ID": "probe-run"}
        plain_env = zygote_runtime_env({"env_vars": env})
        assert zygote_runtime_env({"env_vars": env}, "native") == plain_env  # no such flavour: the plain server
        flavour_env = zygote_runtime_env({"env_vars": env}, "megatron")
        address = flavour_env["env_vars"][ADDRESS_VAR]
        assert address != zygote.address
        assert zygote_runtime_env({"env_vars": env}, "megatron") == flavour_env  # started once
        flavour_pid = zygote.flavour_pids()["megatron"]
        assert _alive(flavour_pid)
        with open(f"/proc/{flavour_pid}/stat") as fh:
            parent = int(fh.read().rsplit(")", 1)[1].split()[1])
        assert parent == zygote.proc.pid, "the flavour is not the zygote's child"
        flavoured, plain = (Probe.options(num_cpus=0, runtime_env=e).remote() for e in (flavour_env, plain_env))
        info, plain_info = ray.get([flavoured.info.remote(), plain.info.remote()], timeout=180)
        assert info["ppid"] == flavour_pid, "the worker is not a child of the flavour"
        assert plain_info["ppid"] == zygote.proc.pid
        assert info["megatron"] and info["settled"], "the flavour's worker lacks its backend's start-up imports"
        assert not plain_info["megatron"] and not plain_info["settled"]  # the plain server is unchanged
        assert info["env"]["HARNESS_RUN_ID"] == "probe-run" and ADDRESS_VAR not in info["env"]
        fresh_probe = Probe.options(num_cpus=0, runtime_env={"env_vars": env}).remote()
        fresh = ray.get(fresh_probe.info.remote(FLAVOURS["megatron"]), timeout=120)  # its start-up's imports
        assert fresh["ppid"] not in (zygote.proc.pid, flavour_pid)
        for key in ("argv0", "path", "signals", "threads", "cwd"):
            assert info[key] == fresh[key], f"a flavour's worker's {key} differs from a fresh one's"
    finally:
        runtime.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(flavour_pid):
        time.sleep(0.1)
    assert not _alive(flavour_pid), "the flavour outlived its zygote"


def test_no_zygote_when_turned_off(monkeypatch):
    monkeypatch.setenv(warm.ZYGOTE_ENV, "0")
    runtime = WarmRuntime()
    try:
        runtime.ensure_ray()
        assert runtime._zygote is None
        assert zygote_runtime_env({"env_vars": {"OMP_NUM_THREADS": "1"}}) == {"env_vars": {"OMP_NUM_THREADS": "1"}}
    finally:
        runtime.close()


def test_a_worker_command_with_ray_site_flags_still_forks(tmp_path):
    """Ray puts ``-s`` before the worker script when the driver runs with ``-I``, ``-s`` or
    ``PYTHONNOUSERSITE`` (``ray._private.services._site_flags``): the client must still hand the
    server the script, not ``-s`` (it ran ``<cwd>/-s``, every forked worker died at start and the
    run waited for workers that never registered)."""
    import subprocess

    from harness.runner.zygote import CLIENT, Zygote

    zygote = Zygote(dict(os.environ))
    try:
        assert zygote.wait_ready(), "the zygote did not start"
        script = tmp_path / "worker.py"
        script.write_text("import os, sys\nprint(os.getppid(), sys.argv[0], sys.argv[1])\n")
        proc = subprocess.run([sys.executable, "-S", "-E", str(CLIENT), "-s", str(script), "arg"],
                              env={**os.environ, ADDRESS_VAR: zygote.address}, capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        ppid, argv0, arg = proc.stdout.split()
        assert int(ppid) == zygote.proc.pid and argv0 == str(script) and arg == "arg"
    finally:
        zygote.close()
