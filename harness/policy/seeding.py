"""Per-rank seeding of a policy process, shared by every policy backend.

A leaf module (torch, ``random``, optionally numpy): the native and the
megatron-core engines both seed through it, so neither imports the other.
"""

from __future__ import annotations

import random

import torch


def seed_rank(seed: int, rank: int) -> None:
    """Seed every RNG of this process from (spec seed, rank)."""
    s = int(seed) * 1000 + int(rank)
    torch.manual_seed(s)
    random.seed(s)
    try:
        import numpy as np

        np.random.seed(s % (2**32))
    except ImportError:  # pragma: no cover
        pass
