"""Seeded synthetic surfaces and manifests, for tests and ``benches/parity_bench.py``.

The documents follow the surface schemas and have realistic shapes (per-rank
sections with coords, ``train/step{N}`` and ``rollout/step{N}/attempt1`` phases,
collectives as ``[op, group_kind, dtype, numel]``), but their values are made up.
Same arguments -> identical documents (``random.Random(seed)``, no global state).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Scale", "SMALL", "QWEN3_235B", "synthetic_surfaces", "synthetic_manifest"]


@dataclass(frozen=True)
class Scale:
    policy_ranks: int
    rollout_ranks: int
    iterations: int
    operators_per_phase: int
    collectives_per_step: int
    metrics: int
    prompts: int
    generations: int
    layout: tuple[tuple[str, int], ...] = (("tp", 2), ("cp", 1), ("dp", 1), ("pp", 1))


SMALL = Scale(policy_ranks=4, rollout_ranks=2, iterations=2, operators_per_phase=6, collectives_per_step=5,
              metrics=4, prompts=2, generations=2, layout=(("tp", 2), ("cp", 1), ("dp", 1), ("pp", 2)))
# The seed's golden: 64 policy ranks TP2/PP4/CP2/DP4, 8 rollout ranks, 3 iterations.
QWEN3_235B = Scale(policy_ranks=64, rollout_ranks=8, iterations=3, operators_per_phase=300,
                   collectives_per_step=2000, metrics=40, prompts=64, generations=16,
                   layout=(("tp", 2), ("cp", 2), ("dp", 4), ("pp", 4)))

_OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "send", "recv",
        "broadcast"]
_GROUPS = ["tp", "cp", "ep", "dp", "pp", "dp_cp", "tp_ep", "etp", "edp"]
_DTYPES = ["float32", "bfloat16", "int64"]


def _coords(rank: int, layout: tuple[tuple[str, int], ...]) -> dict[str, int]:
    out, rest = {}, rank
    for name, size in layout:
        out[name] = rest % size
        rest //= size
    return out


def _rank_ids(scale: Scale) -> list[tuple[str, int, dict]]:
    ids = [("policy", r, _coords(r, scale.layout)) for r in range(scale.policy_ranks)]
    ids += [("rollout", r, {"tp": r % 8}) for r in range(scale.rollout_ranks)]
    return ids


def _phases(role: str, iterations: int) -> list[str]:
    if role == "policy":
        return [f"train/step{n}" for n in range(1, iterations + 1)]
    return ["engine_init"] + [f"rollout/step{n}/attempt1" for n in range(1, iterations + 1)]


def synthetic_surfaces(workload: str = "synthetic", scale: Scale = SMALL, seed: int = 0) -> dict[str, dict]:
    """All eight surface documents (six gated + memory, timings) at ``scale``."""
    rng = random.Random(seed)
    op_names = [f"aten::op_{i:03d}" for i in range(scale.operators_per_phase)]
    docs = {name: {"surface": name, "version": 1, "workload": workload, "sections": {}}
            for name in ("topology", "lifecycle", "operators", "collectives", "rollouts", "training", "memory",
                         "timings")}
    # one collective pattern per role/phase kind, reused across ranks (as in a real SPMD job)
    patterns = {role: [[rng.choice(_OPS), rng.choice(_GROUPS), rng.choice(_DTYPES), rng.randrange(1, 1 << 22)]
                       for _ in range(scale.collectives_per_step)] for role in ("policy", "rollout")}
    for role, rank, coords in _rank_ids(scale):
        sid = f"{role}/rank{rank:05d}"
        phases = _phases(role, scale.iterations)
        events = [{"event": "begin_engine_initialization" if p == "engine_init" else "begin", "phase": p}
                  for p in phases]
        events.append({"event": "close", "phase": None})
        docs["lifecycle"]["sections"][sid] = {"coords": coords, "events": events, "closed": True}
        docs["operators"]["sections"][sid] = {"coords": coords, "phases": {
            p: {"outcome": "finished", "operators": {op: rng.randrange(1, 500) for op in op_names}} for p in phases}}
        docs["collectives"]["sections"][sid] = {"coords": coords, "phases": {
            p: {"outcome": "finished", "collectives": [list(c) for c in patterns[role]]} for p in phases}}
        docs["memory"]["sections"][sid] = {"coords": coords, "phases": {
            p: {"allocated_bytes": float(rng.randrange(1 << 30, 1 << 34)),
                "peak_bytes": float(rng.randrange(1 << 30, 1 << 35))}
            for p in phases}}
        docs["timings"]["sections"][sid] = {"coords": coords,
                                            "phases": {p: {"wall_s": rng.uniform(0.1, 30.0)} for p in phases}}
    for role, count in (("policy", scale.policy_ranks), ("rollout", scale.rollout_ranks)):
        docs["topology"]["sections"][role] = {
            "world_size": count,
            "layout": dict(scale.layout) if role == "policy" else {"tp": min(8, count)},
            "ranks": [{"rank": r, "node": r // 4, "device": r % 4, "coords": c}
                      for rl, r, c in _rank_ids(scale) if rl == role],
            "groups": {"tp": [[r, r + 1] for r in range(0, count - 1, 2)]},
        }
    metric_names = ["loss"] + [f"train/metric_{i:02d}" for i in range(scale.metrics - 1)]
    for step in range(1, scale.iterations + 1):
        docs["training"]["sections"][f"step{step:04d}"] = {
            "step": step, "metrics": {m: rng.uniform(-2.0, 2.0) for m in metric_names}}
        for prompt in range(scale.prompts):
            for gen in range(scale.generations):
                rid = f"s{step:02d}-p{prompt:03d}-g{gen:02d}"
                docs["rollouts"]["sections"][rid] = {
                    "calls": [{"call": 0, "prompt_tokens": rng.randrange(10, 400),
                               "completion_tokens": rng.randrange(1, 800),
                               "chain_digest": f"{rng.getrandbits(64):016x}", "weight_epoch": step - 1}],
                    "terminal": 0, "decision": "train", "sample_digest": f"{rng.getrandbits(64):016x}"}
    return docs


def synthetic_manifest(workload: str = "synthetic", scale: Scale = SMALL, *, platform: str = "cpu") -> dict:
    """A schema-valid manifest v2 for a synthetic run (no artifacts, no surfaces listed)."""
    from harness.manifest.build import new_manifest

    return new_manifest(
        run_id=f"{workload}-synthetic", workload=workload, spec_digest="ab" * 32, harness_version="0.1.0",
        git_commit=None,
        environment={"python": "3.11", "torch": None, "ray": None, "backends": {}, "platform": platform,
                     "device": "cpu", "world_size": scale.policy_ranks},
        topology={"policy": dict(scale.layout), "rollout": {"tp": min(8, scale.rollout_ranks)},
                  "rank_map": [{"role": role, "rank": r, "coords": c} for role, r, c in _rank_ids(scale)]},
        plugins={"policy_profiler": None, "rollout_profiler": None, "versions": {}},
        iterations=scale.iterations, status="complete")
