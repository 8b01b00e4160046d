"""The harness as a consumer gets it: built into a wheel, installed into a fresh venv, run isolated.

Test support for the packaging and walkthrough tests. :func:`install_isolated` builds the
wheel from a copy of this checkout (no network, no build isolation), creates a fresh venv
in a temporary folder and installs only that wheel into it (``pip --python``, so its
``golden`` console script and its pytest11 entry point are the wheel's). The venv gets no
system site packages: the base interpreter may see a harness checkout through a ``.pth``
(an editable install of another checkout). Its third-party dependencies (torch, ray,
pytest, ...) are this test venv's, reached through one ``.pth`` line naming a folder of
symlinks to this venv's site-packages *minus* everything of the harness: its dist-info,
the editable finder and its ``.pth``, and any ``.pth`` that names the checkout. A line of
a ``.pth`` is a path, not a site dir, so the ``.pth`` files in that folder are never run.

So an import of ``harness`` in that venv can only come from the wheel's files: a module
the wheel lacks fails to import, however the checkout is installed here.
:meth:`IsolatedInstall.run` runs its interpreter with ``-I`` (no ``PYTHONPATH``, no user
site, the script's folder not on ``sys.path``) from a working directory outside the
checkout, with the harness's own environment variables removed.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP_IN_COPY = shutil.ignore_patterns(".git", ".venv*", "runs", "build", "dist", "reports", "*.egg-info",
                                      "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache")
_NOT_A_DEPENDENCY = ("__editable__", "grpo_golden_harness", "harness", "__pycache__")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess, what: str) -> str:
    """``proc``'s stdout; an assertion error with its output tails when it exited non-zero."""
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the harness's and pytest's own variables and without
    ``PYTHONPATH``/``PYTHONHOME``/``VIRTUAL_ENV`` (nothing may point back at the checkout)."""
    drop = ("GOLDEN_", "PYTEST_", "GIT_", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(RAY_AUTH_MODE="disabled", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


@dataclass(frozen=True)
class IsolatedInstall:
    """A fresh venv holding the harness from its wheel only."""

    venv: Path
    wheel: Path
    site_packages: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def golden(self) -> Path:
        return self.venv / "bin" / "golden"

    def run(self, args: list[str], cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        """``python -I ARGS`` of the venv in ``cwd`` (which must lie outside the checkout)."""
        assert REPO not in Path(cwd).resolve().parents and Path(cwd).resolve() != REPO, cwd
        return _run([str(self.python), "-I", *args], Path(cwd), env or clean_env(), timeout)

    def shell(self, command: str, cwd: Path, env: dict[str, str] | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
        """``bash -c COMMAND`` in ``cwd`` with the venv's bin/ first on ``PATH`` (so ``golden``,
        ``python`` and ``pytest`` are the venv's), as a consumer's shell or CI job runs it."""
        assert REPO not in Path(cwd).resolve().parents and Path(cwd).resolve() != REPO, cwd
        env = dict(env or clean_env())
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        return subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)


def _dependency_folder(target: Path) -> Path:
    """Symlinks to this venv's site-packages entries except the harness's own (see module doc)."""
    target.mkdir(parents=True)
    repo = str(REPO)
    for source in site.getsitepackages():
        for entry in sorted(Path(source).iterdir()):
            if entry.name.startswith(_NOT_A_DEPENDENCY) or (target / entry.name).exists():
                continue
            if entry.suffix == ".pth":
                continue  # never read from this folder anyway (a path line, not a site dir)
            if entry.is_file() and entry.suffix == ".py" and repo in entry.read_text(errors="replace"):
                continue
            (target / entry.name).symlink_to(entry)
    return target


def install_isolated(base: Path, source: Path = REPO) -> IsolatedInstall:
    """Build the wheel of ``source`` (copied first, so the checkout gets no build/ folder) and
    install it into a fresh venv under ``base`` (about 5-10 s)."""
    env = clean_env()
    src, dist, venv = base / "src", base / "dist", base / "venv"
    shutil.copytree(source, src, symlinks=True, ignore=SKIP_IN_COPY)
    ok(_run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
             "-w", str(dist), str(src)], base, env), "pip wheel")
    (wheel,) = dist.glob("grpo_golden_harness-*.whl")
    base_python = getattr(sys, "_base_executable", None) or sys.executable
    ok(_run([base_python, "-m", "venv", "--without-pip", str(venv)], base, env), "venv")
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = ok(_run([str(venv / "bin" / "python"), "-I", "-c", where], base, env), "purelib").strip()
    deps = _dependency_folder(base / "deps")
    (Path(purelib) / "zz_harness_test_dependencies.pth").write_text(f"{deps}\n")
    ok(_run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
             "--no-index", str(wheel)], base, env), "pip install the wheel")
    return IsolatedInstall(venv=venv, wheel=wheel, site_packages=Path(purelib))


def source_modules(root: Path = REPO) -> list[str]:
    """Every module of the source tree's ``harness`` package, as dotted names."""
    out = []
    for path in sorted((root / "harness").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if any(p.startswith(".") or p == "__pycache__" for p in parts):
            continue
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


IMPORT_ALL = """\
import importlib, json, sys
result = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        result[name] = None
    except BaseException as exc:  # noqa: BLE001 - reported
        result[name] = f"{type(exc).__name__}: {getattr(exc, 'name', None) or exc}"
import harness
finders = [getattr(f, "__module__", "?") + "." + getattr(f, "__qualname__", type(f).__qualname__)
           for f in sys.meta_path]
print(json.dumps({"file": harness.__file__, "path": sys.path, "flags_isolated": sys.flags.isolated,
                  "meta_path": finders, "result": result}))
"""
