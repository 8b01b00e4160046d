"""Placement of rollout engines on a flat device (or side-group rank) axis."""

from __future__ import annotations

from collections.abc import Sequence


def derive_engine_gpu_offsets(engine_gpu_counts: Sequence[int]) -> list[int]:
    """Exclusive prefix sums: ``[c0, c1, ...] -> [0, c0, c0 + c1, ...]``.

    Engine ``i`` owns devices ``[offsets[i], offsets[i] + counts[i])``.
    Invariants: same length as the input; first offset 0 (when non-empty);
    ``offsets[i+1] - offsets[i] == counts[i]``. Counts are not validated
    (0 and negative values pass through), matching the reference behaviour.
    """
    offsets: list[int] = []
    running = 0
    for count in engine_gpu_counts:
        offsets.append(running)
        running += int(count)
    return offsets
