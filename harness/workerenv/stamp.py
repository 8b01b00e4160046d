"""Where worker environments live, the stamp a build leaves, and whether a built one is usable.

Layout: ``<cache>/<backend>/`` is the venv; ``<cache>/<backend>/golden-env.json``
(the stamp) is written last, atomically, by a successful build, so a directory
without a stamp is an interrupted build. The stamp holds the resolved
declaration and its digest, the interpreter, and what the build installed
(``name==version`` of every distribution the environment's Python sees) with
its sha256. :func:`inspect` says what an environment is now:

* ``missing``: no directory; ``incomplete``: a directory without a valid stamp;
* ``stale``: the declaration (or the extras in pyproject.toml) changed since the build;
* ``broken``: the interpreter does not run, or what it sees installed is not what
  the stamp recorded (a package added, removed or upgraded by hand);
* ``ok``.

The cache is ``--cache-dir``, else ``$GOLDEN_ENV_CACHE``, else
``$XDG_CACHE_HOME/grpo-golden-harness/worker-envs`` (``~/.cache/...``): never a
run directory. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.workerenv import declare

STAMP = "golden-env.json"
CACHE_ENV = "GOLDEN_ENV_CACHE"
LIST_TIMEOUT_S = 120.0

# Run in the environment's interpreter: every distribution it sees, sorted.
_LIST_SCRIPT = ("import importlib.metadata as m, json, sys; "
                "print(json.dumps({'python': sys.executable, 'installed': sorted({f\"{d.metadata['Name']}=="
                "{d.version}\" for d in m.distributions() if d.metadata['Name']})}))")


def cache_dir(explicit: str | os.PathLike | None = None, environ: dict | None = None) -> Path:
    """The worker-environment cache (see the module doc for the order)."""
    env = os.environ if environ is None else environ
    if explicit:
        return Path(explicit).expanduser().absolute()
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser().absolute()
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return (base / "grpo-golden-harness" / "worker-envs").absolute()


def env_dir(cache: Path, backend: str) -> Path:
    declare.declaration(backend)  # refuses an unknown backend
    return cache / backend


def python_of(path: Path) -> Path:
    return path / "bin" / "python"


def installed_hash(installed: list[str]) -> str:
    return hashlib.sha256("\n".join(installed).encode()).hexdigest()


def list_installed(python: Path, timeout_s: float = LIST_TIMEOUT_S) -> list[str]:
    """``name==version`` of every distribution ``python`` sees; WorkerEnvError if it does not run."""
    try:
        proc = subprocess.run([str(python), "-c", _LIST_SCRIPT], capture_output=True, text=True,
                              timeout=timeout_s, check=False, env=_clean_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise declare.WorkerEnvError(f"{python}: does not run ({exc})") from None
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-2:])
        raise declare.WorkerEnvError(f"{python}: exited {proc.returncode} listing its packages: {tail}")
    try:
        return list(json.loads(proc.stdout.strip().splitlines()[-1])["installed"])
    except (IndexError, KeyError, ValueError):
        raise declare.WorkerEnvError(f"{python}: printed no package list") from None


def _clean_env() -> dict[str, str]:
    """This process's environment without what would make a child see other packages."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


@dataclass
class EnvState:
    backend: str
    path: Path
    status: str          # ok | missing | incomplete | stale | broken
    reason: str          # why not ok ("" when ok)
    stamp: dict | None

    @property
    def python(self) -> Path:
        return python_of(self.path)

    def refusal(self) -> str:
        """The error for using this environment as it is, naming the command that fixes it."""
        return (f"worker environment {self.backend!r} at {self.path} is {self.status}: {self.reason}; "
                f"build it with: golden env build {self.backend}")


def read_stamp(path: Path) -> dict | None:
    try:
        doc = json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == declare.SCHEMA else None


def inspect(cache: Path, backend: str, *, verify: bool = True, want: dict | None = None) -> EnvState:
    """The state of ``backend``'s environment in ``cache``. ``verify``: also run its interpreter and
    compare what it sees installed with the stamp (a subprocess, ~0.3 s); ``want``: the resolved
    declaration to compare with (default: the current one, as recorded: an overlay stays an overlay)."""
    path = env_dir(cache, backend)
    if not path.exists():
        return EnvState(backend, path, "missing", "not built", None)
    stamp = read_stamp(path)
    if stamp is None:
        return EnvState(backend, path, "incomplete", f"no valid {STAMP} (an interrupted or failed build)", None)
    if want is None:
        recorded = stamp.get("resolved") if isinstance(stamp.get("resolved"), dict) else {}
        want = declare.resolved(declare.declaration(backend), layered_on=recorded.get("layered_on"))
    if stamp.get("digest") != declare.digest(want):
        return EnvState(backend, path, "stale", "its declaration or the project's extras changed since the build",
                        stamp)
    if verify:
        try:
            installed = list_installed(python_of(path))
        except declare.WorkerEnvError as exc:
            return EnvState(backend, path, "broken", str(exc), stamp)
        if installed_hash(installed) != stamp.get("installed_sha256"):
            was, now = set(stamp.get("installed") or []), set(installed)
            return EnvState(backend, path, "broken", "what its Python sees installed differs from the stamp ("
                            f"recorded, not seen: {_few(was - now)}; seen, not recorded: {_few(now - was)})", stamp)
    return EnvState(backend, path, "ok", "", stamp)


def _few(names: set[str], n: int = 3) -> str:
    shown = sorted(names)[:n]
    return (", ".join(shown) or "none") + (f" (+{len(names) - n} more)" if len(names) > n else "")


def write_stamp(path: Path, doc: dict) -> None:
    """Write the stamp atomically (temp file in the directory, fsync, rename)."""
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".stamp-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path / STAMP)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
