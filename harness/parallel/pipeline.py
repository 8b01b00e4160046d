"""Pipeline parallelism: GPipe schedule over blocking p2p send/recv.

All microbatches run forward (stage s receives activations from s-1, sends
to s+1), then all run backward in reverse order (gradients flow s+1 -> s).
Every send is matched by a recv in the same order on the neighbour, so the
schedule cannot deadlock on rendezvous-style p2p. Activations between stages
have a fixed shape `[mbs, S/(cp*tp), H]` known to both sides, so no shape
exchange is needed; uneven stages (`pp_layout`) only change compute per stage.

The stage function is supplied by the caller:
    stage_forward(mb_index, stage_input_or_None) -> output tensor
        (on the last stage: the scalar loss to backpropagate)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist


@dataclass
class StageInfo:
    stage: int
    stages: int
    prev_rank: int | None  # global rank of the previous stage's peer
    next_rank: int | None
    activation_shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1


def stage_info(pp_ranks: list[int], rank: int, activation_shape, dtype) -> StageInfo:
    s = pp_ranks.index(rank)
    return StageInfo(
        stage=s,
        stages=len(pp_ranks),
        prev_rank=pp_ranks[s - 1] if s > 0 else None,
        next_rank=pp_ranks[s + 1] if s + 1 < len(pp_ranks) else None,
        activation_shape=tuple(activation_shape),
        dtype=dtype,
    )


def run_gpipe(
    info: StageInfo,
    num_microbatches: int,
    stage_forward: Callable[[int, torch.Tensor | None], torch.Tensor],
    *,
    backward: bool,
) -> list[torch.Tensor]:
    """Run the schedule; returns the stage outputs per microbatch (detached
    when `backward`). With `backward=False` it is a forward-only pass."""
    inputs: list[torch.Tensor | None] = []
    outputs: list[torch.Tensor] = []
    for m in range(num_microbatches):
        x = None
        if not info.is_first:
            x = torch.empty(info.activation_shape, dtype=info.dtype)
            dist.recv(x, src=info.prev_rank)
            x.requires_grad_(backward)
        y = stage_forward(m, x)
        if not info.is_last:
            dist.send(y.detach().contiguous(), dst=info.next_rank)
        inputs.append(x)
        outputs.append(y)
    if backward:
        for m in reversed(range(num_microbatches)):
            y = outputs[m]
            if info.is_last:
                y.backward()
            else:
                g = torch.empty(info.activation_shape, dtype=info.dtype)
                dist.recv(g, src=info.next_rank)
                y.backward(g)
            if not info.is_first:
                dist.send(inputs[m].grad.contiguous(), dst=info.prev_rank)
            outputs[m] = y.detach()
    return outputs
