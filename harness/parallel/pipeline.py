"""Pipeline parallelism: 1F1B (default) or GPipe schedules over p2p send/recv.

Activations between stages have a fixed shape `[mbs, S/(cp*tp), H]` known to
both sides, so no shape exchange is needed; uneven stages (`pp_layout`) only
change compute per stage. Every microbatch's loss is normalised by the global
counts by the caller, so the schedule only changes the order in which
parameter gradients are accumulated (bits may differ, math does not).

Schedules (`run_pipeline(..., schedule=...)`, default `DEFAULT_SCHEDULE`):

* ``"1f1b"`` (non-interleaved, as in Megatron/PipeDream-Flush): stage `s` of
  `pp` runs `w = min(pp - s - 1, n)` warm-up forwards, then alternates one
  forward / one backward for the remaining `n - w` microbatches, then `w`
  cool-down backwards. Backwards run in microbatch order 0..n-1, and at most
  `min(pp - s, n)` microbatches hold activations at once (GPipe holds `n`).
* ``"gpipe"``: all forwards, then all backwards in reverse order.

Forward-only passes (`backward=False`) are the same for both schedules.

Deadlock freedom: every p2p message between neighbours is matched in FIFO
order per direction (activations s -> s+1 in microbatch order, gradients
s+1 -> s in backward order). Where 1F1B switches direction (a forward
followed by a backward, or a backward followed by a forward) the stage's
send and the matching receive are posted together as `isend` + `irecv` and
then waited, so two neighbours that both send at that moment cannot block
each other even if p2p is rendezvous-style; all other transfers are
blocking `send`/`recv` exactly as in GPipe. All ranks of one stage (tp/cp/dp
peers) run the same op sequence, so the collectives inside the stage
function stay in the same order everywhere.

The stage function is supplied by the caller:
    stage_forward(mb_index, stage_input_or_None) -> output tensor
        (on the last stage: the scalar loss to backpropagate)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from harness import taps
from harness.parallel import settle

SCHEDULES = ("1f1b", "gpipe")
DEFAULT_SCHEDULE = "1f1b"


@dataclass
class StageInfo:
    stage: int
    stages: int
    prev_rank: int | None  # global rank of the previous stage's peer
    next_rank: int | None
    activation_shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device = torch.device("cpu")  # where activations and their grads live

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1


def stage_info(
    pp_ranks: list[int], rank: int, activation_shape, dtype, device: torch.device | None = None
) -> StageInfo:
    s = pp_ranks.index(rank)
    return StageInfo(
        stage=s,
        stages=len(pp_ranks),
        prev_rank=pp_ranks[s - 1] if s > 0 else None,
        next_rank=pp_ranks[s + 1] if s + 1 < len(pp_ranks) else None,
        activation_shape=tuple(activation_shape),
        dtype=dtype,
        device=torch.device("cpu") if device is None else device,
    )


# -- op orders (pure) ------------------------------------------------------------


def one_f_one_b_order(stage: int, stages: int, num_microbatches: int) -> list[tuple[str, int]]:
    """The non-interleaved 1F1B op sequence of one stage: [("F", m) | ("B", m)]."""
    if not 0 <= stage < stages:
        raise ValueError(f"stage {stage} outside 0..{stages - 1}")
    n = num_microbatches
    warmup = min(stages - stage - 1, n)
    ops = [("F", m) for m in range(warmup)]
    for i in range(n - warmup):
        ops.append(("F", warmup + i))
        ops.append(("B", i))
    ops += [("B", m) for m in range(n - warmup, n)]
    return ops


def gpipe_order(stage: int, stages: int, num_microbatches: int) -> list[tuple[str, int]]:
    del stage, stages
    n = num_microbatches
    return [("F", m) for m in range(n)] + [("B", m) for m in reversed(range(n))]


# -- executors --------------------------------------------------------------------


def run_pipeline(
    info: StageInfo,
    num_microbatches: int,
    stage_forward: Callable[[int, torch.Tensor | None], torch.Tensor],
    *,
    backward: bool,
    schedule: str | None = None,
) -> list[torch.Tensor]:
    """Run `schedule` (default `DEFAULT_SCHEDULE`); returns the stage outputs
    per microbatch (detached when `backward`)."""
    schedule = DEFAULT_SCHEDULE if schedule is None else schedule
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; expected one of {SCHEDULES}")
    if schedule == "gpipe" or not backward:
        return run_gpipe(info, num_microbatches, stage_forward, backward=backward)
    return run_1f1b(info, num_microbatches, stage_forward)


def run_gpipe(
    info: StageInfo,
    num_microbatches: int,
    stage_forward: Callable[[int, torch.Tensor | None], torch.Tensor],
    *,
    backward: bool,
) -> list[torch.Tensor]:
    """GPipe; returns the stage outputs per microbatch (detached when
    `backward`). With `backward=False` it is a forward-only pass."""
    inputs: list[torch.Tensor | None] = []
    outputs: list[torch.Tensor] = []
    for m in range(num_microbatches):
        x = None
        if not info.is_first:
            x = torch.empty(info.activation_shape, dtype=info.dtype, device=info.device)
            dist.recv(x, src=info.prev_rank)
            taps.collective("recv", "pp", x, phase="forward", mb=m)
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
                g = torch.empty(info.activation_shape, dtype=info.dtype, device=info.device)
                dist.recv(g, src=info.next_rank)
                taps.collective("recv", "pp", g, phase="backward", mb=m)
                y.backward(g)
            if not info.is_first:
                dist.send(inputs[m].grad.contiguous(), dst=info.prev_rank)
            outputs[m] = y.detach()
    return outputs


def _exchange(send: torch.Tensor, send_peer: int, recv: torch.Tensor, recv_peer: int) -> None:
    """Post a send and a receive together, wait for both, and for gloo to let go of the tensors
    (harness.parallel.settle: the received gradient goes on into autograd)."""
    tensors = [send, recv]
    baseline = settle.use_counts(tensors)
    works = [dist.isend(send, dst=send_peer), dist.irecv(recv, src=recv_peer)]
    for w in works:
        w.wait()
    del works, w
    if send.device.type == "cpu":
        settle.wait_released(tensors, baseline)


def run_1f1b(
    info: StageInfo,
    num_microbatches: int,
    stage_forward: Callable[[int, torch.Tensor | None], torch.Tensor],
    *,
    on_op: Callable[[str, int], None] | None = None,
) -> list[torch.Tensor]:
    """Non-interleaved 1F1B with backward; returns detached stage outputs.
    `on_op(kind, m)` (tests) is called before each forward / backward."""
    n = num_microbatches
    ops = one_f_one_b_order(info.stage, info.stages, n)
    inputs: dict[int, torch.Tensor | None] = {}
    live: dict[int, torch.Tensor] = {}  # microbatch -> output awaiting backward
    outputs: list[torch.Tensor | None] = [None] * n
    ready_x: dict[int, torch.Tensor] = {}  # inputs received ahead of their forward
    ready_g: dict[int, torch.Tensor] = {}  # output grads received ahead of their backward

    def new_buf() -> torch.Tensor:
        return torch.empty(info.activation_shape, dtype=info.dtype, device=info.device)

    for i, (kind, m) in enumerate(ops):
        nxt = ops[i + 1] if i + 1 < len(ops) else None
        if on_op is not None:
            on_op(kind, m)
        if kind == "F":
            x = None
            if not info.is_first:
                x = ready_x.pop(m, None)
                if x is None:
                    x = new_buf()
                    dist.recv(x, src=info.prev_rank)
                taps.collective("recv", "pp", x, phase="forward", mb=m)
                x.requires_grad_(True)
            y = stage_forward(m, x)
            inputs[m], live[m] = x, y
            if not info.is_last:
                out = y.detach().contiguous()
                if nxt is not None and nxt[0] == "B":
                    g = new_buf()
                    _exchange(out, info.next_rank, g, info.next_rank)
                    taps.collective("recv", "pp", g, phase="backward", mb=nxt[1])
                    ready_g[nxt[1]] = g
                else:
                    dist.send(out, dst=info.next_rank)
        else:
            y = live.pop(m)
            if info.is_last:
                y.backward()
            else:
                g = ready_g.pop(m, None)
                if g is None:
                    g = new_buf()
                    dist.recv(g, src=info.next_rank)
                taps.collective("recv", "pp", g, phase="backward", mb=m)
                y.backward(g)
            outputs[m] = y.detach()
            x = inputs.pop(m)
            if not info.is_first:
                dx = x.grad.contiguous()
                if nxt is not None and nxt[0] == "F":
                    nx = new_buf()
                    _exchange(dx, info.prev_rank, nx, info.prev_rank)
                    taps.collective("recv", "pp", nx, phase="forward", mb=nxt[1])
                    ready_x[nxt[1]] = nx
                else:
                    dist.send(dx, dst=info.prev_rank)
    assert not live and not ready_x and not ready_g, "1F1B schedule left work behind"
    return outputs  # type: ignore[return-value]
