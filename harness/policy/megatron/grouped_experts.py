"""megatron-core's local experts as two grouped GEMMs on cuda (``SequentialMLP`` kept as is).

megatron-core's ``SequentialMLP`` runs every local expert's ``MLP`` from a Python loop:
a host sync (``tokens_per_expert.tolist()``), then per expert two matmuls and the
SwiGLU, about twenty operators forward and backward; 64 experts x 8 layers make that
tens of thousands of launches per training step. Its ``GroupedMLP`` needs the
``grouped_gemm`` package and bf16, and holds the weights in another layout.

:func:`install` swaps the forward of each ``SequentialMLP`` of a model for
:func:`grouped_forward`: the same parameters (``local_experts.{j}.linear_fc1.weight``
``[2I, H]``, ``linear_fc2.weight`` ``[H, I]``, so names, refit, checkpoints and the
reference weights do not change), stacked per call into the right operands of two
``torch._grouped_mm`` calls (``harness.model.grouped``). The math is ``MLP.forward``'s
for this configuration: ``fc2(silu(gate) * up * prob)``, gate and up the two halves of
fc1's output, the product rounded back to the input dtype. Gradients flow through the
stacks to every expert's weight.

Only where nothing else differs (:func:`unsupported` names why not): cuda, a dtype of
``grouped_dtypes()``, the gated SiLU without bias, clamp or offset, no fp8/fp4, probs
not applied on the input, an expert tensor-parallel group of one (the linear layers do
no communication of their own) and more than one local expert. Everywhere else, the CPU
included, megatron's loop runs unchanged, so no CPU golden moved. The grouped path
rounds differently from the loop (another GEMM kernel), so a cuda megatron run is a
function of its setting: the cuda golden was refreshed on it (issue 20).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from harness.model.grouped import use_grouped


def unsupported(module: Any) -> str | None:
    """Why ``module`` (a megatron ``SequentialMLP``) keeps megatron's loop, or None."""
    cfg = module.config
    checks = (
        (module.num_local_experts > 1, "one local expert"),
        (cfg.gated_linear_unit and cfg.activation_func is F.silu, "not the gated SiLU"),
        (not cfg.add_bias_linear, "biased expert linears"),
        (getattr(cfg, "activation_func_clamp_value", None) is None, "a clamped activation"),
        (not getattr(cfg, "glu_linear_offset", 0.0), "a GLU linear offset"),
        (not (getattr(cfg, "fp8", None) or getattr(cfg, "fp4", None)), "fp8/fp4 experts"),
        (not getattr(cfg, "moe_apply_probs_on_input", False), "probs applied on the input"),
        (not getattr(cfg, "use_te_activation_func", False), "Transformer Engine's activation"),
        (module.tp_group.size() == 1, f"expert tensor parallelism {module.tp_group.size()}"),
    )
    for ok, reason in checks:
        if not ok:
            return reason
    return None


def stack_fc(module: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fc1 [E, H, 2I], fc2 [E, I, H])``: the local experts' weights as the grouped
    matmul's right operands (transposed views of the stacks; differentiable)."""
    fc1 = torch.stack([e.linear_fc1.weight for e in module.local_experts]).transpose(1, 2)
    fc2 = torch.stack([e.linear_fc2.weight for e in module.local_experts]).transpose(1, 2)
    return fc1, fc2


def grouped_swiglu_scaled(x: torch.Tensor, fc1: torch.Tensor, fc2: torch.Tensor, tokens_per_expert: torch.Tensor,
                          probs: torch.Tensor) -> torch.Tensor:
    """Every expert's ``fc2(silu(gate) * up * prob)`` over its block of ``x [S, H]`` (rows
    sorted by expert, ``tokens_per_expert [E]`` rows each), ``probs [S]`` the routing weight
    of each row; ``[S, H]`` in ``x``'s dtype."""
    offs = torch.cumsum(tokens_per_expert.to(x.device), dim=0).to(torch.int32)
    h = torch._grouped_mm(x, fc1, offs=offs)
    gate, up = torch.chunk(h, 2, dim=-1)
    act = (F.silu(gate) * up * probs.unsqueeze(-1)).to(x.dtype)
    return torch._grouped_mm(act, fc2, offs=offs)


def grouped_forward(self: Any, permuted_local_hidden_states: torch.Tensor, tokens_per_expert: torch.Tensor,
                    permuted_probs: torch.Tensor):
    """``SequentialMLP.forward`` as two grouped GEMMs (module docstring) for a module
    :func:`install` accepted (its configuration does not change); megatron's own loop where
    the tokens are not on a grouped device and dtype, or there are none."""
    x = permuted_local_hidden_states
    if not use_grouped(x) or x.shape[0] == 0:
        return type(self).forward(self, x, tokens_per_expert, permuted_probs)
    fc1, fc2 = stack_fc(self)
    return grouped_swiglu_scaled(x, fc1, fc2, tokens_per_expert, permuted_probs), None


def install(model: torch.nn.Module) -> int:
    """Route every supported ``SequentialMLP`` of ``model`` through :func:`grouped_forward`
    (an instance attribute: the class and its other instances are untouched); returns how
    many. Meant for a cuda model; on the CPU the installed forward runs megatron's loop anyway."""
    from megatron.core.transformer.moe.experts import SequentialMLP

    count = 0
    for module in model.modules():
        if isinstance(module, SequentialMLP) and unsupported(module) is None:
            module.forward = grouped_forward.__get__(module)
            count += 1
    return count
