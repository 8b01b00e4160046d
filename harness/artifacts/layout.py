"""Run-directory layout: the relative paths both halves agree on.

Every path here is relative to the run directory and uses ``/`` separators, so
it can be stored in ``run.json`` and in manifests unchanged. Pure: no torch,
no ray, no filesystem access.
"""

from __future__ import annotations

import re

RUN_JSON = "run.json"
METRICS = "metrics.jsonl"
ROLLOUTS = "rollouts.jsonl"
DATAPLANE = "dataplane.sqlite"
LEDGER = "ledger.sqlite"
MANIFEST = "manifest.json"
SURFACES_DIR = "surfaces"
ARTIFACTS_DIR = "artifacts"

TRACE_ROLES = ("policy", "rollout", "teacher")  # teacher: a distillation workload's teacher ranks
TRACE_SUFFIX = ".trace.jsonl"

_TRACE_RE = re.compile(r"^artifacts/(policy|rollout|teacher)/rank(\d{5,})(?:\.seg(\d+))?\.trace\.jsonl$")


def trace_path(role: str, rank: int, segment: int = 0) -> str:
    """``artifacts/{role}/rank{rank:05d}.trace.jsonl`` for ``role`` in TRACE_ROLES.

    A run resumed from a checkpoint writes segment ``n >= 1`` of each trace to
    ``rank{rank:05d}.seg{n}.trace.jsonl``; postflight merges the segments at
    the checkpoint boundary (``harness.artifacts.segments``).
    """
    if role not in TRACE_ROLES:
        raise ValueError(f"trace role must be one of {TRACE_ROLES}, got {role!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"trace rank must be a non-negative int, got {rank!r}")
    if isinstance(segment, bool) or not isinstance(segment, int) or segment < 0:
        raise ValueError(f"trace segment must be a non-negative int, got {segment!r}")
    seg = f".seg{segment}" if segment else ""
    return f"{ARTIFACTS_DIR}/{role}/rank{rank:05d}{seg}{TRACE_SUFFIX}"


def policy_trace_path(rank: int) -> str:
    """Trace artifact of policy rank ``rank`` (global training rank)."""
    return trace_path("policy", rank)


def rollout_trace_path(rank: int) -> str:
    """Trace artifact of rollout profiler instance ``rank`` (dense rollout rank)."""
    return trace_path("rollout", rank)


def parse_trace_path(rel_path: str) -> tuple[str, int]:
    """Inverse of :func:`trace_path` for the first segment: ``(role, rank)``;
    ValueError for any other path."""
    role, rank, segment = parse_trace_segment(rel_path)
    if segment:
        raise ValueError(f"not a first-segment trace artifact path: {rel_path!r}")
    return role, rank


def parse_trace_segment(rel_path: str) -> tuple[str, int, int]:
    """Inverse of :func:`trace_path`: ``(role, rank, segment)``."""
    match = _TRACE_RE.match(rel_path)
    if match is None:
        raise ValueError(f"not a trace artifact path: {rel_path!r}")
    return match.group(1), int(match.group(2)), int(match.group(3) or 0)


NUMERICS_DIR = f"{ARTIFACTS_DIR}/numerics"
_NUMERICS_RE = re.compile(r"^artifacts/numerics/(policy)/rank(\d{5,})\.step(\d{4,})\.json$")


def numerics_path(role: str, rank: int, step: int) -> str:
    """``artifacts/numerics/{role}/rank{rank:05d}.step{step:04d}.json``: the numerics digests
    a rank recorded in train step ``step`` (step 0: the initial parameters, or the record of a
    rank that records none). Only the policy role records numerics."""
    if role != "policy":
        raise ValueError(f"numerics role must be 'policy', got {role!r}")
    trace_path(role, rank)  # validates the rank
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"numerics step must be a non-negative int, got {step!r}")
    return f"{NUMERICS_DIR}/{role}/rank{rank:05d}.step{step:04d}.json"


def parse_numerics_path(rel_path: str) -> tuple[str, int, int]:
    """Inverse of :func:`numerics_path`: ``(role, rank, step)``."""
    match = _NUMERICS_RE.match(rel_path)
    if match is None:
        raise ValueError(f"not a numerics artifact path: {rel_path!r}")
    return match.group(1), int(match.group(2)), int(match.group(3))


def section_name(role: str, rank: int) -> str:
    """Surface section of a per-rank artifact, e.g. ``policy/rank00003``."""
    trace_path(role, rank)  # validates
    return f"{role}/rank{rank:05d}"
