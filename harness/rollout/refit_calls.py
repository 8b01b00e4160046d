"""A rollout worker's refit request, checked and fanned out to its TP ranks.

``per_rank_refit_calls(label, tp, transport, kw, default_addresses)`` returns the
engine-process method to call and one keyword dict per TP rank:

* ``zmq``: ``receive_weights_zmq`` with ``address`` (``kw["addresses"]``, one per
  TP rank, else ``default_addresses()``) and ``timeout_ms`` (default
  ``harness.refit.zmq_stream.DEFAULT_TIMEOUT_MS``);
* ``broadcast``: ``receive_weights_broadcast`` with ``host``, ``port``,
  ``world_size``, ``buffer_size_bytes``, ``src`` (default 0) and ``rank`` =
  ``rank_offset + r`` for TP rank ``r`` (side-group ranks follow densely), plus
  ``prefix`` / ``timeout_s`` when given.

``ValueError`` naming the worker for a wrong address count, a missing broadcast
field or an unknown transport: nothing is called then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from harness.refit.zmq_stream import DEFAULT_TIMEOUT_MS

BROADCAST_REQUIRED = ("host", "port", "world_size", "rank_offset", "buffer_size_bytes")


def per_rank_refit_calls(label: str, tp: int, transport: str, kw: Mapping[str, Any],
                         default_addresses: Callable[[], list[str]]) -> tuple[str, list[dict[str, Any]]]:
    if transport == "zmq":
        addresses = list(kw.get("addresses") or default_addresses())
        if len(addresses) != tp:
            raise ValueError(f"zmq refit of {label}: {len(addresses)} addresses for tp={tp}")
        timeout_ms = int(kw.get("timeout_ms", DEFAULT_TIMEOUT_MS))
        return "receive_weights_zmq", [{"address": a, "timeout_ms": timeout_ms} for a in addresses]
    if transport == "broadcast":
        missing = [k for k in BROADCAST_REQUIRED if k not in kw]
        if missing:
            raise ValueError(f"broadcast refit of {label} needs {missing}")
        optional = {k: kw[k] for k in ("prefix", "timeout_s") if k in kw}
        return "receive_weights_broadcast", [
            {
                "host": kw["host"], "port": int(kw["port"]), "world_size": int(kw["world_size"]),
                "rank": int(kw["rank_offset"]) + r, "buffer_size_bytes": int(kw["buffer_size_bytes"]),
                "src": int(kw.get("src", 0)), **optional,
            }
            for r in range(tp)
        ]
    raise ValueError(f"refit transport must be 'zmq' or 'broadcast', got {transport!r}")
