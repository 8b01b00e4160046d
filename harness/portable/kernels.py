"""Portable CPU kernels: the ops whose bits still move between x86-64 machine kinds under the pins.

With ATen pinned to its AVX2 kernels and MKL to its COMPATIBLE branch
(``harness.portable.pins``), every op a golden workload runs gives the same bits
on AMD and Intel machines but one: float32 ``sqrt``. ATen's float32 square root
is not correctly rounded (about 17% of results differ from the IEEE value in the
last bit on any one machine), and which results differ depends on the machine.
IEEE square root is correctly rounded, so one portable answer exists: the
correctly rounded value.

``sqrt_f32`` computes it as the float64 square root rounded once to float32.
That is correctly rounded for every float32 input (subnormals included) as long
as the float64 root is within a relative 2**-40 of the exact one, and every
float64 kernel is far closer (about 2**-53). Why: a float32 result's rounding
boundary is a midpoint ``m`` of 25 significant bits, and for a float32 ``x``
scaled to an integer ``X``, ``X - m**2`` is an odd multiple of ``2**-24`` (never
zero), so ``sqrt(x)`` is at least a relative ``2**-39`` away from every
boundary. Any float64 root then rounds to the same float32.

:func:`install` registers it for ``aten::sqrt``, ``aten::sqrt_`` and
``aten::sqrt.out`` on the CPU dispatch key (``torch.library``, the way the cuda
decode path swaps in its invariant kernels), so every caller gets it: AdamW's
denominator, ``pow(x, 0.5)`` callers that go through ``sqrt``, the foreach
fallback. Autograd is unchanged (its formula reads the forward's result).
Other dtypes keep ATen's kernel (``pow(x, 0.5)``, which ATen computes with the
square-root kernel without entering the ``sqrt`` operator again).
"""

from __future__ import annotations

import threading
import warnings

import torch

__all__ = ["OVERRIDDEN", "activate", "install", "installed", "sqrt_f32"]

OVERRIDDEN = ("sqrt", "sqrt_", "sqrt.out")  # aten operators this module serves on the CPU key

_lock = threading.Lock()
_library: torch.library.Library | None = None  # kept alive for the process: dropping it undoes the override


def sqrt_f32(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of a float32 tensor (module doc)."""
    return torch.ops.aten.pow.Tensor_Scalar(x.to(torch.float64), 0.5).to(torch.float32)


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.float32:
        return sqrt_f32(x)
    return torch.ops.aten.pow.Tensor_Scalar(x, 0.5)


def _sqrt_(x: torch.Tensor) -> torch.Tensor:
    return x.copy_(_sqrt(x))


def _sqrt_out(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    result = _sqrt(x)
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


def install() -> bool:
    """Serve :data:`OVERRIDDEN` with the portable kernels in this process (idempotent);
    True when this call installed them."""
    global _library
    with _lock:
        if _library is not None:
            return False
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # "Overriding a previously registered kernel": the point
            warnings.simplefilter("ignore", UserWarning)
            lib.impl("sqrt", _sqrt, "CPU")
            lib.impl("sqrt_", _sqrt_, "CPU")
            lib.impl("sqrt.out", _sqrt_out, "CPU")
        _library = lib
        return True


def installed() -> bool:
    return _library is not None


def activate() -> None:
    """Put this (pinned) process in the portable state: fp32 matmul at IEEE precision (MKL's
    sgemm, never a oneDNN bf16/tf32 path) and the portable kernels installed. Raises
    RuntimeError when ATen does not run the pinned capability (the variable was not in the
    environment before torch loaded): such a process would compute other bits."""
    from harness.portable.pins import PINS

    wanted = PINS["ATEN_CPU_CAPABILITY"].upper()
    got = torch.backends.cpu.get_cpu_capability()
    if got != wanted:
        raise RuntimeError(f"CPU numerics not pinned in this process: ATen runs its {got} kernels, the pins "
                           f"ask for {wanted} (ATEN_CPU_CAPABILITY must be set before torch is imported)")
    if hasattr(torch.backends.mkldnn, "matmul"):
        torch.backends.mkldnn.matmul.fp32_precision = "ieee"
    install()
