"""One CPU golden per CPU numerics key: ``<platform>@<key>`` beside ``<platform>``.

A CPU golden holds only on machines with its CPU numerics (``harness.numerics``).
The store keeps the first one captured under the platform's own name and
others as variants, named ``<platform>@<key>`` (``cpu@intel-f6m167``), each a
complete golden of its own with its own PROVENANCE. Every golden records the key
of the machine it was captured on (manifest ``environment.cpu_numerics``);
goldens written before the key existed record none (``unrecorded``).

Which golden a machine with key ``K`` reads (:func:`read_platform`):

1. ``<platform>@K`` when it exists;
2. else ``<platform>``, when it is absent, records ``K`` or records nothing
   (an unrecorded golden is compared as before the key existed);
3. else ``<platform>@K``, which does not exist: a golden recorded on other
   numerics is never compared bit for bit, the check is refused as a missing
   golden (:func:`mismatch_note` says whose numerics the stored one has).

Which golden a capture or refresh writes (:func:`write_platform`) is the one
it reads, except that ``beside=True`` (``golden refresh --numerics-variant``)
adds ``<platform>@K`` beside an unrecorded ``<platform>`` instead of replacing
it, and case 3 writes the new variant. Non-CPU platforms (``key=None``) are
never split. A name that already carries ``@`` is used as given.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.store import layout

__all__ = ["SEPARATOR", "base_platform", "manifest_key", "mismatch_note", "read_platform", "recorded_key",
           "unrecorded_note", "variant", "write_platform"]

SEPARATOR = "@"
MAX_MANIFEST_BYTES = 8 << 20  # a golden manifest is a few KiB; the key is read, not the whole store


def variant(platform: str, key: str) -> str:
    return f"{platform}{SEPARATOR}{key}"


def base_platform(name: str) -> str:
    """The scheduled platform a stored name belongs to (``cpu@intel-f6m167`` -> ``cpu``)."""
    return name.split(SEPARATOR, 1)[0]


def manifest_key(manifest: object) -> str | None:
    """The numerics key a manifest document records (``environment.cpu_numerics.key``, or
    ``environment.cuda_numerics.key`` for a cuda run); None when it records none or the
    document is not shaped like a manifest."""
    environment = manifest.get("environment") if isinstance(manifest, dict) else None
    if not isinstance(environment, dict):
        return None
    numerics = environment.get("cpu_numerics") or environment.get("cuda_numerics")
    key = numerics.get("key") if isinstance(numerics, dict) else None
    return key if isinstance(key, str) else None


def recorded_key(root: str | Path, workload: str, platform: str) -> str | None:
    """The CPU numerics key the stored golden records; None when it records none, is absent or
    unreadable (reading the golden itself then says what is wrong with it)."""
    path = layout.golden_dir(root, workload, platform) / layout.MANIFEST
    try:
        with open(path, "rb") as fh:
            return manifest_key(json.loads(fh.read(MAX_MANIFEST_BYTES + 1)[:MAX_MANIFEST_BYTES]))
    except (OSError, ValueError):
        return None


def _exists(root: str | Path, workload: str, platform: str) -> bool:
    return layout.golden_dir(root, workload, platform).is_dir()


def read_platform(root: str | Path, workload: str, platform: str, key: str | None) -> str:
    """The stored platform name a machine with CPU numerics ``key`` compares against (module doc)."""
    if key is None or SEPARATOR in platform:
        return platform
    own = variant(platform, key)
    if _exists(root, workload, own):
        return own
    if not _exists(root, workload, platform):
        return platform
    recorded = recorded_key(root, workload, platform)
    return platform if recorded in (None, key) else own


def write_platform(root: str | Path, workload: str, platform: str, key: str | None, *,
                   beside: bool = False) -> str:
    """The stored platform name a capture or refresh on numerics ``key`` writes (module doc)."""
    read = read_platform(root, workload, platform, key)
    if (beside and key is not None and read == platform and SEPARATOR not in platform
            and _exists(root, workload, platform) and recorded_key(root, workload, platform) is None):
        return variant(platform, key)
    return read


def mismatch_note(root: str | Path, workload: str, stored: str) -> str:
    """Why a variant is missing when the platform's own golden is on other numerics ('' otherwise)."""
    if SEPARATOR not in stored:
        return ""
    base, key = base_platform(stored), stored.split(SEPARATOR, 1)[1]
    if not _exists(root, workload, base):
        return ""
    theirs = recorded_key(root, workload, base)
    if theirs is None or theirs == key:
        return ""
    return (f"; the {base!r} golden was captured on CPU numerics {theirs!r} and this machine's are {key!r}: "
            "bit-exact parity holds only between machines with one key (docs/gate.md, CPU numerics)")


def unrecorded_note(root: str | Path, workload: str, stored: str, key: str | None) -> str:
    """For a failed check: the note that the golden compared with records no CPU numerics, so
    rounding findings may come from another kind of machine rather than from a change ('' when
    the golden records a key, is a variant, or the run has no key). Read case 2 of the module
    doc: an unrecorded golden is compared bit for bit, as before the key existed."""
    if key is None or SEPARATOR in stored or not stored.startswith("cpu") or not _exists(root, workload, stored):
        return ""
    if recorded_key(root, workload, stored) is not None:
        return ""
    return (f"note: the {stored!r} golden of {workload} records no CPU numerics (captured before keys were "
            f"recorded) and this machine's are {key!r}. If the only failures are last-bit differences in "
            "rollouts and training with no code change, this machine's CPU kernels round differently from "
            f"the capturing one's: store this machine's variant with `golden refresh {workload} "
            f"--platform {base_platform(stored)} --numerics-variant --reason TEXT` (docs/gate.md, CPU numerics)")
