"""Golden store layout: where a golden lives and how its temporary siblings are named.

::

    goldens/<workload>/workload.yaml              the workload spec (engineer A's loader)
    goldens/<workload>/<platform>/manifest.json   manifest v2 of the captured run
    goldens/<workload>/<platform>/surfaces/<name>.json   canonical surface documents
    goldens/<workload>/<platform>/PROVENANCE.json who/when/why/how (see provenance.py)
    goldens/<workload>/<platform>/tolerances.yaml optional lane overrides (harness.parity.tolerances)
    goldens/<workload>/<platform>@<key>/...       the same for another CPU numerics key (variants.py)

Writers build ``goldens/<workload>/.<platform>.tmp-<random>/`` and rename it into
place; an interrupted write leaves only such dot-prefixed siblings (or, on a system
without atomic directory exchange, ``.<platform>.old-<random>/``), which the next
access removes. Names starting with ``.`` are never goldens.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["MANIFEST", "PROVENANCE", "TOLERANCES", "SURFACES_DIR", "check_name", "golden_dir",
           "temp_prefix", "old_prefix", "is_leftover"]

MANIFEST = "manifest.json"
PROVENANCE = "PROVENANCE.json"
TOLERANCES = "tolerances.yaml"
FOOTPRINT = "FOOTPRINT.json"  # what the golden's run read (harness.footprint; optional)
SURFACES_DIR = "surfaces"
WORKLOAD_FILE = "workload.yaml"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PLATFORM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(@[A-Za-z0-9][A-Za-z0-9_.-]*)?$")  # one @key (variants.py)


def check_name(kind: str, value: str) -> str:
    """A workload or platform name: letters, digits, ``_ . -``, not starting with ``.``; a platform
    may carry one ``@<key>`` qualifier, a CPU-numerics variant (``harness.store.variants``)."""
    pattern = _PLATFORM if kind == "platform" else _NAME
    if not isinstance(value, str) or not pattern.match(value) or value in (".", ".."):
        raise ValueError(f"invalid {kind} name {value!r}: use letters, digits, '_', '.', '-' (not leading)")
    return value


def golden_dir(root: str | Path, workload: str, platform: str) -> Path:
    return Path(root) / check_name("workload", workload) / check_name("platform", platform)


def temp_prefix(platform: str) -> str:
    return f".{platform}.tmp-"


def old_prefix(platform: str) -> str:
    return f".{platform}.old-"


def is_leftover(name: str) -> bool:
    """True for the temporary siblings an interrupted write can leave behind."""
    return name.startswith(".") and (".tmp-" in name or ".old-" in name)
