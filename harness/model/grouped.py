"""Grouped expert GEMMs: every expert's SwiGLU over its tokens in two grouped matmuls.

``torch._grouped_mm`` multiplies row blocks of one ``[S, K]`` operand (the slots,
sorted by expert; ``offs`` the cumulative block ends) by a per-expert ``[K, N]``
matrix in one kernel, instead of one ``F.linear`` per expert from a Python loop.

Used on cuda for bfloat16 and float32 (``use_grouped``). bfloat16 runs torch's grouped
kernel (CUTLASS on sm90); float32 runs group by group in C++, without the Python loop's
host sync per layer (fwd+bwd 0.40 s against the loop's 1.00 s on an H200, docs/gpu.md).
The cuda goldens were refreshed on this path (issue 20). The CPU keeps the per-expert
loop, so a CPU run dispatches exactly the operators it did (no CPU golden moved).
``HARNESS_GROUPED_FP32=0`` in the process's environment turns float32 back to the loop
on cuda (it rounds differently, so an fp32 cuda run then differs from its golden).
The reference model's stacked expert layout (``expert_layout="stacked"``) holds these
operands as its parameters (``ExpertStack.operands``), so it skips ``stack_experts``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F

GROUPED_DTYPES = (torch.bfloat16, torch.float32)
GROUPED_FP32_ENV = "HARNESS_GROUPED_FP32"


def grouped_dtypes() -> tuple[torch.dtype, ...]:
    """``GROUPED_DTYPES``, less float32 where ``$HARNESS_GROUPED_FP32`` is ``0`` (the opt-out)."""
    if os.environ.get(GROUPED_FP32_ENV) == "0":
        return tuple(d for d in GROUPED_DTYPES if d != torch.float32)
    return GROUPED_DTYPES


def use_grouped(x: torch.Tensor) -> bool:
    """Whether the MoE of ``x``'s tokens runs as grouped GEMMs: cuda, a ``grouped_dtypes()``
    dtype, torch has the op. Never on the CPU."""
    return x.is_cuda and x.dtype in grouped_dtypes() and hasattr(torch, "_grouped_mm")


def stack_experts(experts: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-expert ``(gate [I, H], up [I, H], down [H, I])`` -> ``(gate_up [E, H, 2I], down [E, I, H])``,
    the grouped matmul's right operands (differentiable: gradients flow to each expert's weights).
    Three copies (two stacks and one cat), not one cat per expert: the same values and layout
    (``gate_up`` is a transposed view of a contiguous ``[E, 2I, H]``), fewer launches."""
    gates = torch.stack([g for g, _, _ in experts])
    ups = torch.stack([u for _, u, _ in experts])
    gate_up = torch.cat((gates, ups), dim=1).transpose(1, 2)
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
