"""Build (or verify and reuse) one backend's worker environment: ``golden env build``.

A build, under a per-backend lock (``<cache>/.<backend>.lock``): removes what is
there unless it is ``ok`` (see ``stamp.inspect``), makes a venv with the
harness's own interpreter (``python -m venv``), installs with pip (torch and Ray
pinned on every call, ``declare.pins``; ``first`` requirements, then the harness from this checkout,
editable, with the declared extras; then the ``remove`` list uninstalled),
imports every declared module in it, and writes the stamp last. pip's output
goes to ``<cache>/<backend>.build.log``. A second build of an ``ok``
environment installs nothing: it verifies (the stamp's digest, and that the
environment's Python runs and sees exactly the recorded packages) and returns;
``golden doctor`` imports the declared modules.

``overlay=True`` builds a venv without pip whose site-packages holds one
``.pth`` that adds this interpreter's site-packages: a separate interpreter
(its own ``sys.executable`` and ``sys.prefix``) that installs nothing and sees
this one's packages. Seconds to build; for tests and development, recorded as
such (``layered_on`` in the stamp and digest).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import site
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.workerenv import declare, stamp

PIP_TIMEOUT_S = 3600.0


class BuildFailed(RuntimeError):
    """A build step failed (pip, venv, the import check); the message names the step and the log."""


@dataclass
class BuildResult:
    backend: str
    path: Path
    action: str        # built | reused
    reason: str        # why it was (re)built, or "" when reused
    seconds: float


@contextmanager
def _lock(cache: Path, backend: str) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{backend}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: list[str], log: Path, step: str, timeout_s: float = PIP_TIMEOUT_S) -> None:
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        try:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s, check=False,
                                  env=stamp._clean_env())
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildFailed(f"{step}: {exc} (log: {log})") from None
    if proc.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise BuildFailed(f"{step} exited {proc.returncode} (log: {log}): {tail}")


def _site_packages(path: Path) -> Path:
    return path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def check_imports(python: Path, modules: tuple[str, ...], timeout_s: float = 300.0) -> str | None:
    """None when every module imports in ``python``; else the error's last line."""
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    try:
        proc = subprocess.run([str(python), "-c", code, *modules], capture_output=True, text=True,
                              timeout=timeout_s, check=False, env=stamp._clean_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: {exc}"
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit {proc.returncode}"


def _install(path: Path, decl: declare.EnvDeclaration, log: Path, overlay: bool) -> None:
    base = sys.executable
    if overlay:
        _run([base, "-m", "venv", "--without-pip", str(path)], log, "python -m venv")
        dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
        lines = [f"import site; site.addsitedir({d!r})" for d in dirs]
        (_site_packages(path) / "_golden_overlay.pth").write_text("\n".join(lines) + "\n")
        return
    _run([base, "-m", "venv", str(path)], log, "python -m venv")
    py = str(stamp.python_of(path))
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    if decl.first:
        _run([*pip, *declare.pins(), *decl.first], log, f"pip install {' '.join(decl.first)}")
    root = declare.project_root()
    target = f"{root}[{','.join(decl.extras)}]" if decl.extras else str(root)
    _run([*pip, *declare.pins(), "-e", target], log, f"pip install -e .[{','.join(decl.extras)}]")
    if decl.remove:
        _run([py, "-m", "pip", "uninstall", "-q", "-y", *decl.remove], log, f"pip uninstall {' '.join(decl.remove)}")


def build(backend: str, cache: Path, *, overlay: bool = False,
          say: Callable[[str], None] = lambda msg: None) -> BuildResult:
    """Build ``backend``'s environment in ``cache``, or verify and reuse it (see the module doc).

    Raises WorkerEnvError (unknown backend, unreadable extras) and BuildFailed."""
    decl = declare.declaration(backend)
    want = declare.resolved(decl, layered_on=sys.executable if overlay else None)
    t0 = time.perf_counter()
    with _lock(cache, backend):
        state = stamp.inspect(cache, backend, want=want)
        if state.status == "ok":  # verified: the stamp's digest and package list match
            return BuildResult(backend, state.path, "reused", "", time.perf_counter() - t0)
        reason = state.reason if state.status != "missing" else "not built"
        say(f"{backend}: building in {state.path} ({state.status}: {reason})")
        if state.path.exists():
            shutil.rmtree(state.path)
        log = cache / f"{backend}.build.log"
        log.write_text("")
        _install(state.path, decl, log, overlay)
        problem = check_imports(stamp.python_of(state.path), decl.imports)
        if problem is not None:
            raise BuildFailed(f"{backend}: built, but an import fails in it: {problem} (log: {log})")
        installed = stamp.list_installed(stamp.python_of(state.path))
        seconds = time.perf_counter() - t0
        stamp.write_stamp(state.path, {
            "schema": declare.SCHEMA, "backend": backend, "resolved": want, "digest": declare.digest(want),
            "python": str(stamp.python_of(state.path)), "kind": "overlay" if overlay else "venv",
            "installed": installed, "installed_sha256": stamp.installed_hash(installed),
            "build_s": round(seconds, 1), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        })
    return BuildResult(backend, state.path, "built", reason, seconds)


def built_python(path: Path) -> str:
    """The environment's interpreter as workers start it (the venv's bin/python, not resolved:
    resolving the symlink would leave the venv)."""
    return os.fspath(stamp.python_of(path))
