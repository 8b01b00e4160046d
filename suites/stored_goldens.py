"""The repository's goldens as a run on this machine sees them: test support.

A CPU golden may be stored once per CPU numerics key (``harness.store.variants``):
``goldens/<workload>/cpu`` and ``goldens/<workload>/cpu@<key>``. Tests that read a
stored golden's files, or copy it into a goldens root of their own, take the folder
this machine compares with, so they hold on every machine that has its golden.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.numerics import cpu_numerics
from harness.spec.load import default_goldens_root
from harness.store.layout import golden_dir
from harness.store.variants import read_platform


def stored_dir(workload: str, platform: str = "cpu", root: Path | None = None) -> Path:
    """The golden folder a run of ``workload`` on this machine compares with (``platform`` or its
    CPU-numerics variant; non-CPU platforms are never split)."""
    root = Path(root or default_goldens_root())
    numerics = cpu_numerics() if platform.startswith("cpu") else None
    key = numerics["key"] if numerics else None
    return golden_dir(root, workload, read_platform(root, workload, platform, key))


def copy_stored(workload: str, dst_root: Path, platform: str = "cpu", *, as_workload: str | None = None) -> Path:
    """Copy :func:`stored_dir` into ``dst_root/<as_workload or workload>/`` under its own folder name
    (a variant stays a variant there); returns the copy."""
    source = stored_dir(workload, platform)
    target = Path(dst_root) / (as_workload or workload) / source.name
    shutil.copytree(source, target)
    return target
