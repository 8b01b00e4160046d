"""GRPO trainers (sync, dataplane, streaming, distill) over the policy and rollout workers."""

from __future__ import annotations


def trainer_class(name: str):
    """The trainer class for ``grpo.trainer``; imports lazily (torch, ray)."""
    if name == "sync":
        from harness.grpo.sync import SyncTrainer as cls
    elif name == "dataplane":
        from harness.grpo.dataplane import DataPlaneTrainer as cls
    elif name == "streaming":
        from harness.grpo.streaming import StreamingTrainer as cls
    elif name == "distill":
        from harness.grpo.distill import DistillTrainer as cls
    else:
        raise ValueError(f"grpo.trainer: unknown trainer {name!r} (sync | dataplane | streaming | distill)")
    return cls
