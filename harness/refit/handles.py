"""Aggregation of per-sample IPC handles across policy workers (docs/refit.md).

Pure Python (no torch): the driver collects one result per policy worker,
``{"dp_rank": int, "per_sample_handles": list}``, and regroups them per
global sample. Workers sharing a DP rank (TP/CP replicas) each hold one
shard of every sample of that rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

LENGTH_MISMATCH = "per_sample_handles length mismatch"


def aggregate_per_sample_handles(worker_results: Iterable[Mapping[str, Any]]) -> list[dict[str, list[Any]]]:
    """``[{"teacher_shards": [shard of worker w for w sharing the DP rank]}, ...]``.

    DP ranks are visited in ascending order; within a rank, samples in local
    index order, and a sample's shards in input order of the workers of that
    rank. Output length = sum over DP ranks of that rank's sample count.
    Workers of one DP rank must report equal list lengths, else
    ``AssertionError("per_sample_handles length mismatch ...")``; different DP
    ranks may differ. Empty input gives ``[]``. The result does not depend on
    the order of workers *across* DP ranks.
    """
    by_rank: dict[int, list[list[Any]]] = {}
    for result in worker_results:
        by_rank.setdefault(result["dp_rank"], []).append(list(result["per_sample_handles"]))
    out: list[dict[str, list[Any]]] = []
    for dp_rank in sorted(by_rank):
        shards = by_rank[dp_rank]
        n = len(shards[0])
        if any(len(s) != n for s in shards):
            raise AssertionError(
                f"{LENGTH_MISMATCH} within dp_rank {dp_rank}: {[len(s) for s in shards]}"
            )
        out.extend({"teacher_shards": [s[i] for s in shards]} for i in range(n))
    return out
