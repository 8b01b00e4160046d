"""The refit transports of ``harness.registry.refit``: one class per registered transport.

Each class holds the three halves of its transport (the role,
:class:`harness.registry.refit.RefitTransport`):

* ``refit`` runs in the driver and drives the :class:`~harness.grpo.refitter.Refitter`'s
  mechanics of that transport (the zmq streams per engine and their endpoints record; the
  broadcast side group);
* ``send`` runs in policy rank 0 (``PolicyWorker.stream_weights``): ``zmq`` ->
  ``send_weights_zmq(items, address=..., buffer_size_bytes=...)``; ``broadcast`` ->
  ``broadcast_weights(items, group, buffer_size_bytes=...)`` where ``group`` is
  ``kw["side_group"]`` itself (a ``SideGroup``) or, for a mapping of ``create_side_group``
  arguments, rank 0's session group (joined by the first broadcast, reused after);
* ``receive_calls`` runs in a rollout worker (``harness.rollout.refit_calls``):

  * ``zmq``: ``receive_weights_zmq`` with ``address`` (``kw["addresses"]``, one per
    TP rank, else ``default_addresses()``) and ``timeout_ms`` (default
    ``harness.refit.zmq_stream.DEFAULT_TIMEOUT_MS``);
  * ``broadcast``: ``receive_weights_broadcast`` with ``host``, ``port``,
    ``world_size``, ``buffer_size_bytes``, ``src`` (default 0) and ``rank`` =
    ``rank_offset + r`` for TP rank ``r`` (side-group ranks follow densely), plus
    ``prefix`` / ``timeout_s`` when given.

Imports torch and pyzmq (never Ray: the zygote preloads the rollout worker, which reaches
this module when a refit arrives).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from harness.refit import broadcast
from harness.refit.zmq_stream import DEFAULT_TIMEOUT_MS, send_weights_zmq

BROADCAST_REQUIRED = ("host", "port", "world_size", "rank_offset", "buffer_size_bytes")


class ZmqTransport:
    """``rollout.refit.transport: zmq``."""

    name = "zmq"

    def refit(self, refitter: Any, phases: dict[str, float]) -> list[int]:
        versions = [refitter.zmq_refit_engine(i, w, phases) for i, w in enumerate(refitter.workers)]
        refitter.record_endpoints()
        return versions

    def on_device(self, kw: Mapping[str, Any]) -> bool:
        return kw.get("staging_device") not in (None, "cpu")  # CUDA IPC staging

    def send(self, worker: Any, items: list[tuple[str, Any]], kw: dict[str, Any], collect_s: float) -> Any:
        t1 = time.perf_counter()
        stats = send_weights_zmq(items, **kw)
        stats.seconds.update(collect=collect_s, send=time.perf_counter() - t1)
        return stats

    def receive_calls(self, label: str, tp: int, kw: Mapping[str, Any],
                      default_addresses: Callable[[], list[str]]) -> tuple[str, list[dict[str, Any]]]:
        addresses = list(kw.get("addresses") or default_addresses())
        if len(addresses) != tp:
            raise ValueError(f"zmq refit of {label}: {len(addresses)} addresses for tp={tp}")
        timeout_ms = int(kw.get("timeout_ms", DEFAULT_TIMEOUT_MS))
        return "receive_weights_zmq", [{"address": a, "timeout_ms": timeout_ms} for a in addresses]


class BroadcastTransport:
    """``rollout.refit.transport: broadcast``."""

    name = "broadcast"

    def refit(self, refitter: Any, phases: dict[str, float]) -> list[int]:
        return refitter.broadcast_refit()

    def on_device(self, kw: Mapping[str, Any]) -> bool:
        return False

    def send(self, worker: Any, items: list[tuple[str, Any]], kw: dict[str, Any], collect_s: float) -> Any:
        side = kw.pop("side_group")
        group = side if not isinstance(side, Mapping) else worker._side_group.join(**side)  # its SideGroupSlot
        return broadcast.broadcast_weights(items, group, **kw)

    def receive_calls(self, label: str, tp: int, kw: Mapping[str, Any],
                      default_addresses: Callable[[], list[str]]) -> tuple[str, list[dict[str, Any]]]:
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
