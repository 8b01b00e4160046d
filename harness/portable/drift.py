"""The numerics canary stored with the goldens, and environment drift.

``<goldens root>/numerics-canary.json`` holds the canary battery's digests
(``harness.portable.canary``) under the pins, with the pin set they were taken
under::

    {"schema": 1, "pin_set": "x86_64-pins1-...", "ops": {"sgemm_128x64x256": "<16 hex>", ...},
     "captured_on": {"model_name": ..., "torch": ...}}

Before a pinned CPU gate run compares anything (``golden check``, the pytest
plugin's first golden workload), :func:`check` runs the battery in a fresh
interpreter with the run's environment (about 2 s) and compares it op by op.
Any op that moved, a missing op or another pin set is :class:`Drift`: the
machine (or a process's environment) does not compute the bits the goldens were
captured with, so the run gets no verdict (exit 3) and the message names the
ops, instead of a flood of last-bit findings in every rollout and training row.
A goldens root without a canary is not refused (nothing to compare: a new
store); ``golden capture`` and ``golden refresh`` store one where none is.

Standard library only (the battery runs in a child process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.portable import pins

__all__ = ["CANARY_FILE", "Drift", "check", "compare", "measure", "read", "store"]

CANARY_FILE = "numerics-canary.json"
SCHEMA = 1
MAX_BYTES = 1 << 20
TIMEOUT_S = 120


class Drift(Exception):
    """This machine's pinned kernels do not give the stored canary's bits (no verdict)."""

    def __init__(self, message: str, moved: list[str]) -> None:
        super().__init__(message)
        self.moved = moved


def path(goldens_root: str | Path) -> Path:
    return Path(goldens_root) / CANARY_FILE


def read(goldens_root: str | Path) -> dict | None:
    """The stored canary; None when the goldens root holds none. Raises ValueError (naming the
    file) when it is unreadable or not a canary document."""
    file = path(goldens_root)
    try:
        with open(file, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"{file}: unreadable ({exc.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise ValueError(f"{file}: larger than {MAX_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{file}: not JSON ({exc})") from None
    ops = doc.get("ops") if isinstance(doc, dict) else None
    if (not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("pin_set"), str)
            or not isinstance(ops, dict) or not ops
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in ops.items())):
        raise ValueError(f"{file}: not a numerics canary (schema {SCHEMA}: pin_set and a non-empty ops map)")
    return doc


def measure(environ: dict[str, str] | None = None) -> dict:
    """Run the battery in a fresh interpreter with ``environ`` (this process's by default):
    ``{"state": ..., "ops": {...}}``. Raises RuntimeError when the child fails."""
    from harness import code_identity

    env = {**(os.environ if environ is None else environ), **code_identity.exported()}
    env["CUDA_VISIBLE_DEVICES"] = ""
    try:
        out = subprocess.run([sys.executable, code_identity.SAFE_PATH_FLAG, "-m", "harness.portable.canary"], env=env,
                             capture_output=True,
                             text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"numerics canary: the battery did not finish in {TIMEOUT_S} s") from None
    if out.returncode != 0:
        raise RuntimeError(f"numerics canary: the battery failed (exit {out.returncode}): {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(stored: dict, measured: dict) -> list[str]:
    """The ops whose digests differ (or that one side lacks), in the stored order."""
    got = measured.get("ops", {})
    names = list(stored["ops"]) + [op for op in got if op not in stored["ops"]]
    return [op for op in names if stored["ops"].get(op) != got.get(op)]


def check(goldens_root: str | Path, environ: dict[str, str] | None = None) -> str:
    """Refuse environment drift before a pinned CPU run (module doc); returns a one-line summary
    (``"numerics canary: 23/23 ops equal ..."``, or why nothing was compared). Raises
    :class:`Drift` naming the ops that moved; ValueError for an unreadable stored canary."""
    stored = read(goldens_root)
    if stored is None:
        return f"numerics canary: none stored in {goldens_root} (capture or refresh stores one)"
    if stored["pin_set"] != pins.pin_set_id():
        raise Drift(f"numerics canary: the stored canary ({path(goldens_root)}) was taken under pin set "
                    f"{stored['pin_set']!r} and this harness pins {pins.pin_set_id()!r}: the goldens were "
                    "captured with other CPU code paths; refresh them", [])
    measured = measure(environ)
    moved = compare(stored, measured)
    if moved:
        state = measured.get("state", {})
        raise Drift(f"numerics canary: {len(moved)} of {len(stored['ops'])} ops give other bits on this machine "
                    f"than the stored canary: {', '.join(moved)} (this process: ATen {state.get('capability')}, "
                    f"pins {state.get('pins')}, portable kernels {state.get('portable_kernels')}); environment "
                    f"drift, not a regression: no verdict (docs/gate.md, 'CPU numerics')", moved)
    return f"numerics canary: {len(stored['ops'])}/{len(stored['ops'])} ops bit-equal to {path(goldens_root).name}"


def store(goldens_root: str | Path, measured: dict, captured_on: dict) -> Path:
    """Write the canary (atomically: a sibling file renamed over it)."""
    file = path(goldens_root)
    file.parent.mkdir(parents=True, exist_ok=True)  # a first capture may create the goldens root
    doc = {"schema": SCHEMA, "pin_set": pins.pin_set_id(), "ops": measured["ops"], "captured_on": captured_on}
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, file)
    return file
