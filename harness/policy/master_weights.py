"""AdamW over fp32 master weights for a low-precision (bf16, fp16) policy.

The model computes in its own dtype; the optimizer keeps an fp32 copy of every
parameter and its AdamW moments in fp32. ``step`` casts the (already reduced
and clipped) low-precision gradients up, steps the fp32 masters, and writes
them back rounded to the model's dtype, so updates smaller than the model
dtype's resolution accumulate instead of vanishing. Quacks like the
``torch.optim.AdamW`` it wraps where the engines use it (``step``,
``zero_grad``, ``state_dict``/``load_state_dict``, ``param_groups``); the state
dict carries the masters, so a checkpoint restores them exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)


def needs_master_weights(params: Iterable[torch.Tensor]) -> bool:
    """Whether any parameter is in a low-precision dtype (``LOW_PRECISION``)."""
    return any(p.dtype in LOW_PRECISION for p in params)


class MasterWeightsAdamW:
    def __init__(self, params: Iterable[torch.nn.Parameter], **adamw: Any) -> None:
        self.params = list(params)
        self.master = [p.detach().to(torch.float32).clone().requires_grad_(True) for p in self.params]
        self.inner = torch.optim.AdamW(self.master, **adamw)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        self.inner.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.to(torch.float32)
        self.inner.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m)

    def state_dict(self) -> dict[str, Any]:
        return {"adamw": self.inner.state_dict(), "master": [m.detach().clone() for m in self.master]}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"adamw", "master"} or len(state["master"]) != len(self.master):
            raise ValueError("optimizer state is not a MasterWeightsAdamW state of this model "
                             f"(keys {sorted(state)}, {len(state.get('master', []))} masters for {len(self.master)})")
        self.inner.load_state_dict(state["adamw"])
        for m, saved in zip(self.master, state["master"]):
            m.copy_(saved)
