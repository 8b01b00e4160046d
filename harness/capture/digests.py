"""Digests that bind staged token deltas, chains and cumulative sequences.

All are sha256 hex strings over fixed little-endian encodings, so they are
identical on every platform and recomputable from staged rows alone:

  delta digest      H("delta1" | ids int64 | mask float32 | logprobs float32)
  chain hash        H("chain1" | parent chain hash or "" | ":" | delta digest)
  cumulative hash   H("cum1" | cumulative ids int64)

Masks and logprobs are hashed as float32 so a digest is byte-exact whatever
float width the caller used before the value was rounded to float32.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

GENESIS = ""


def _ids_bytes(token_ids: Sequence[int]) -> bytes:
    return np.asarray(token_ids, dtype="<i8").tobytes()


def delta_digest(token_ids: Sequence[int], mask: Sequence[float], logprobs: Sequence[float]) -> str:
    h = hashlib.sha256(b"delta1")
    h.update(len(token_ids).to_bytes(8, "little"))
    h.update(_ids_bytes(token_ids))
    h.update(np.asarray(mask, dtype="<f4").tobytes())
    h.update(np.asarray(logprobs, dtype="<f4").tobytes())
    return h.hexdigest()


def chain_hash(parent_chain_hash: str | None, digest: str) -> str:
    return hashlib.sha256(f"chain1|{parent_chain_hash or GENESIS}:{digest}".encode()).hexdigest()


def cumulative_hash(token_ids: Sequence[int]) -> str:
    return hashlib.sha256(b"cum1" + _ids_bytes(token_ids)).hexdigest()


def unit_interval(seed: int, key: str) -> float:
    """Deterministic value in [0, 1) for (seed, key): fault-injection draws."""
    raw = hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8]
    return int.from_bytes(raw, "little") / 2**64


def error_name(exc: BaseException) -> str:
    """The class name of an error for a failure reason, the same whether it
    was raised here or came back wrapped from a Ray actor (its `cause`)."""
    cause = getattr(exc, "cause", None)
    return type(cause).__name__ if isinstance(cause, BaseException) else type(exc).__name__
