"""``grpo.trainer`` -> the GRPO trainer class: the registry and the role's Protocol.

Stdlib only: a trainer module (torch, Ray) is imported by :func:`trainer_class`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from harness.registry import load_target


@runtime_checkable
class Trainer(Protocol):
    """The GRPO step loop over the policy group and the rollout workers.

    Built by the run session as ``cls(spec, policy, workers, driver, loader, tokenizer,
    env, refit, dataplane=...)``; ``step(i)`` runs step ``i`` (rollouts, logprobs, the
    train phase, the refit) and returns its ``harness.grpo.trainer.StepOutput``."""

    name: str

    def step(self, step: int) -> Any: ...

    def train_phase(self, step: int, batch: dict, timings: dict) -> dict[str, float]: ...


TrainerFactory = Callable[..., Trainer]

TRAINERS: dict[str, str] = {  # grpo.trainer -> "module:Class"
    "sync": "harness.grpo.sync:SyncTrainer",
    "dataplane": "harness.grpo.dataplane:DataPlaneTrainer",
    "streaming": "harness.grpo.streaming:StreamingTrainer",
    "distill": "harness.grpo.distill:DistillTrainer",  # needs the distill: block (docs/distill.md)
}


def trainer_class(name: str) -> TrainerFactory:
    """The trainer class for ``grpo.trainer`` ``name``; imports its module now (torch, Ray)."""
    if name not in TRAINERS:
        raise ValueError(f"grpo.trainer: unknown trainer {name!r} ({' | '.join(TRAINERS)})")
    return load_target(TRAINERS[name])
