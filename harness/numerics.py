"""The CPU numerics key: which machines give bit-identical CPU results.

A CPU golden is bit-exact only between machines whose floating-point code paths
agree. MKL picks its GEMM kernels, and torch its vector width (AVX2, AVX-512),
from the CPU's vendor and microarchitecture, and the last bits of a sum move
with them: the same tree, torch wheel and seeds gave logprobs 1e-8 apart
(relative) on an AMD EPYC with AVX-512 and on an Intel Xeon with AVX-512 and
AMX, enough to change every rollout digest of every CPU golden.

The key names the microarchitecture as ``/proc/cpuinfo`` reports it (x86:
vendor, family, model; Arm: implementer, part) plus a digest of the environment
variables that override those choices (:data:`OVERRIDES`), e.g.
``intel-f6m167`` or ``amd-f25m17-env1a2b3c4d``. Two machines with one key run
the same code paths; the key is conservative, so machines of different models
that happen to agree get different keys (and each its own golden), never one
key for two code paths, as far as vendor and model decide them.
``harness.store.variants`` stores one CPU golden per key.

Under the pins (``harness.portable.pins``: ATen's AVX2 kernels, MKL's
COMPATIBLE branch, the portable kernels) every x86-64 machine computes the
same bits, so a pinned process's key is the pin set's (``x86_64-pins1-...``),
whatever the machine; vendor, family and model are still recorded. An unpinned
process (``GOLDEN_CPU_PINS=0``, an aarch64 machine, a vLLM run) keeps the
machine's key, so a golden captured pinned is never compared with it.

Pure standard library, bounded reads: the gate half computes it before a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from harness.portable import pins

__all__ = ["OVERRIDES", "cpu_numerics", "cuda_numerics", "first_processor", "numerics_key"]

CPUINFO = "/proc/cpuinfo"
MAX_CPUINFO_BYTES = 1 << 20  # one processor's block is a few KiB; never read more than this

# Environment variables that change which kernels torch, MKL or oneDNN run on the same CPU.
OVERRIDES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE",
             "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")

_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "hygon"}


def first_processor(path: str = CPUINFO) -> dict[str, str]:
    """``key: value`` fields of the first processor block of a cpuinfo file (empty when unreadable)."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_CPUINFO_BYTES).decode("utf-8", "replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the end of the first block
            continue
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def _int(value: str | None) -> int | None:
    try:
        return int(value, 0) if value is not None else None
    except ValueError:
        return None


def cpu_numerics(cpuinfo: str = CPUINFO, environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """This machine's CPU numerics: ``{"key", "vendor", "family", "model", "model_name", "overrides"}``;
    None when the cpuinfo file names no vendor this module knows how to key (then CPU goldens
    are not split by machine, as before the key existed)."""
    environ = os.environ if environ is None else environ
    fields = first_processor(cpuinfo)
    overrides = {name: environ[name] for name in OVERRIDES if environ.get(name)}
    vendor_id = fields.get("vendor_id")
    if vendor_id is not None:
        family, model = _int(fields.get("cpu family")), _int(fields.get("model"))
        if family is None or model is None:
            return None
        short = _VENDORS.get(vendor_id, "".join(c for c in vendor_id.lower() if c.isalnum()) or "x86")
        base = f"{short}-f{family}m{model}"
    elif "CPU implementer" in fields:
        implementer, part = _int(fields.get("CPU implementer")), _int(fields.get("CPU part"))
        if implementer is None or part is None:
            return None
        vendor_id, family, model = f"arm-{implementer:#x}", implementer, part
        base = f"arm-i{implementer:x}p{part:x}"
    else:
        return None
    key = numerics_key(base, overrides)
    pinned = False
    if fields.get("vendor_id") is not None and pins.in_force(environ) and environ.get(pins.OFF_VAR) != "0":
        # every x86-64 machine under the pins runs one set of code paths: one key for all of them;
        # a variable beyond the pins that changes kernels still splits it
        extra = {k: v for k, v in overrides.items() if k not in pins.PINS}
        key, pinned = numerics_key(pins.pin_set_id(), extra), True
    return {
        "key": key,
        "pinned": pinned,
        "vendor": vendor_id,
        "family": family,
        "model": model,
        "model_name": fields.get("model name"),
        "overrides": overrides,
    }


def numerics_key(base: str, overrides: Mapping[str, str]) -> str:
    """``base``, plus ``-env`` and 8 hex digits of the overriding variables when any is set."""
    if not overrides:
        return base
    digest = hashlib.sha256(json.dumps(dict(sorted(overrides.items()))).encode()).hexdigest()[:8]
    return f"{base}-env{digest}"


# What decides a cuda run's bits: the GPU architecture (compute capability: kernels are built and
# chosen per architecture) and the libraries that pick them (torch's build, with its cuBLAS), never
# the card's name: an H100 and an H200 are both sm_90 and share a key (and so a golden).
CUBLAS_DISTRIBUTIONS = ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12")
NVIDIA_SMI_TIMEOUT_S = 10


def _nvidia_smi() -> str | None:
    """``name, compute_cap, driver_version`` of the first visible GPU (nvidia-smi), or None."""
    visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    cmd = ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"]
    if visible:
        cmd.insert(1, f"--id={visible}")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def cuda_numerics(query: Callable[[], str | None] = _nvidia_smi) -> dict[str, Any] | None:
    """This machine's cuda numerics: ``{"key", "device_name", "capability", "torch", "cublas",
    "driver"}``, keyed ``sm<major><minor>-torch<version>[-cublas<version>]``; None when no GPU
    answers (then cuda goldens are not split, as before the key existed). Standard library:
    nvidia-smi and installed distributions' metadata."""
    line = query()
    if not line:
        return None
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 3 or not parts[1].replace(".", "").isdigit():
        return None
    name, capability, driver = parts[0], parts[1], parts[2]
    torch_version, cublas = _dist_version("torch"), _dist_version(*CUBLAS_DISTRIBUTIONS)
    key = f"sm{capability.replace('.', '')}-torch{torch_version or 'none'}"
    if cublas:
        key += f"-cublas{cublas}"
    return {"key": "".join(c if c.isalnum() or c in "._-" else "_" for c in key), "device_name": name,
            "capability": capability, "torch": torch_version, "cublas": cublas, "driver": driver}
