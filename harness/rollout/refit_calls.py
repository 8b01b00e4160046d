"""A rollout worker's refit request, checked and fanned out to its TP ranks.

``per_rank_refit_calls(label, tp, transport, kw, default_addresses)`` returns the
engine-process method to call and one keyword dict per TP rank: the
``receive_calls`` of transport ``transport``'s registry entry
(``harness.registry.refit``; what each transport takes: ``harness.refit.transport``).

``ValueError`` naming the worker for a wrong address count or a missing broadcast
field, and ``UnknownTransport`` (a ``ValueError``) for an unknown transport: nothing
is called then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from harness.registry.refit import refit_transport


def per_rank_refit_calls(label: str, tp: int, transport: str, kw: Mapping[str, Any],
                         default_addresses: Callable[[], list[str]]) -> tuple[str, list[dict[str, Any]]]:
    return refit_transport(transport).receive_calls(label, tp, kw, default_addresses)
