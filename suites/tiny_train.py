"""A tiny deterministic train function for the profiler-hook tests.

``tiny_train(data, loss_fn, eval_mode)`` has the signature the policy hooks'
``run_train`` calls: one seeded 8x8 matmul, relu, sum and backward, so a
profiled phase sees a fixed, small operator inventory. Returns the loss.
"""

from __future__ import annotations

import torch


def tiny_train(data: torch.Tensor, loss_fn=None, eval_mode: bool = False) -> float:
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    loss = (data @ w).relu().sum()
    loss.backward()
    return float(loss.detach())
