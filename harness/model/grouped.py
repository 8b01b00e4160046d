"""Grouped expert GEMMs: every expert's SwiGLU over its tokens in two grouped matmuls.

``torch._grouped_mm`` multiplies row blocks of one ``[S, K]`` operand (the slots,
sorted by expert; ``offs`` the cumulative block ends) by a per-expert ``[K, N]``
matrix in one kernel, instead of one ``F.linear`` per expert from a Python loop.

Used on cuda for bfloat16 (``use_grouped``): that is where the grouped kernel
(CUTLASS on sm90) exists, and where no golden pins the per-expert loop's bits. The
CPU path and fp32 on cuda keep the per-expert loop, so they dispatch exactly the
operators they did (the CPU and fp32 cuda goldens do not move). Opt-in:
``HARNESS_GROUPED_FP32=1`` in the process's environment adds float32 on cuda
(torch runs it group by group in C++, without the Python loop's host sync per
layer: fwd+bwd 0.40 s against the loop's 1.00 s on an H200, docs/gpu.md); it
rounds differently from the loop, so it moves the fp32 cuda goldens' training
surfaces (off by default).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F

GROUPED_DTYPES = (torch.bfloat16,)
GROUPED_FP32_ENV = "HARNESS_GROUPED_FP32"


def grouped_dtypes() -> tuple[torch.dtype, ...]:
    """``GROUPED_DTYPES``, plus float32 where ``$HARNESS_GROUPED_FP32`` is ``1``."""
    if os.environ.get(GROUPED_FP32_ENV) == "1":
        return (*GROUPED_DTYPES, torch.float32)
    return GROUPED_DTYPES


def use_grouped(x: torch.Tensor) -> bool:
    """Whether the MoE of ``x``'s tokens runs as grouped GEMMs: cuda, a ``grouped_dtypes()``
    dtype, torch has the op. Never on the CPU."""
    return x.is_cuda and x.dtype in grouped_dtypes() and hasattr(torch, "_grouped_mm")


def stack_experts(experts: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-expert ``(gate [I, H], up [I, H], down [H, I])`` -> ``(gate_up [E, H, 2I], down [E, I, H])``,
    the grouped matmul's right operands (differentiable: gradients flow to each expert's weights)."""
    gate_up = torch.stack([torch.cat((g, u), dim=0) for g, u, _ in experts]).transpose(1, 2)
    down = torch.stack([d for _, _, d in experts]).transpose(1, 2)
    return gate_up, down


def grouped_swiglu(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``ops.swiglu`` of each expert's block of ``x [S, H]`` (slots sorted by expert, ``counts [E]``
    slots per expert) with ``stack_experts`` operands, as two ``torch._grouped_mm`` calls."""
    offs = torch.cumsum(counts, dim=0).to(torch.int32)
    inter = down.shape[1]
    gu = torch._grouped_mm(x, gate_up, offs=offs)
    act = F.silu(gu[:, :inter]) * gu[:, inter:]
    return torch._grouped_mm(act, down, offs=offs)
