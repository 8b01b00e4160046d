"""Numerics taps: where the model's code names a module call for the numerics probe.

``call(name, fn, *args, level=...)`` runs ``fn(*args)``. With no probe installed (the
default, and every rollout engine) it is exactly that call and nothing else: no tensor
is copied, no autograd node added, no operator dispatched. With a probe installed
(``harness.policy.numerics_probe``) and ``level`` within its depth, the probe digests the
output in forward and the gradient arriving at it in backward (a pre-hook on the output's
autograd node: no extra operator either). ``collective(op, group, out)`` records a collective's result after its
wait (``harness.parallel``: the TP/CP/EP/SP gathers, reduce-scatters, all-reduces and
all-to-alls in forward and backward, the pipeline's received activations and gradients, the
gradient reductions); with no probe it returns at once. A leaf: imports nothing of the harness.

Levels: ``BLOCK`` (embedding, each layer's attention and MoE block, the final norm and
head) and ``MODULE`` (every projection, norm, RoPE, the core attention, the router and
each expert as well).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

BLOCK = 1
MODULE = 2
DEPTHS = {"off": 0, "blocks": BLOCK, "modules": MODULE}

_probe: Any = None


def install(probe: Any) -> None:
    """Make ``probe`` (an object with ``level`` and ``call(name, fn, args)``) the process's
    probe; ``None`` removes it."""
    global _probe
    _probe = probe


def active() -> Any:
    return _probe


def call(name: str, fn: Callable[..., Any], *args: Any, level: int = MODULE) -> Any:
    """``fn(*args)``, recorded under module ``name`` when a probe wants ``level``."""
    p = _probe
    if p is None or level > p.level or not p.recording:
        return fn(*args)
    return p.call(name, fn, args)


def collective(op: str, group: Any, out: Any, *, phase: str | None = None, mb: int | None = None) -> None:
    """Record a collective's result ``out`` (after its wait) when a probe records at depth
    ``modules`` (``blocks`` stays the cheap depth): keyed by
    ``op``, the group's kind (``group_desc``: tp, cp, ep, dp_cp, ...; ``None`` the world)
    and this step's call index of the pair in ``phase`` (None: told by the autograd engine)."""
    p = _probe
    if p is None or not p.recording or p.level < MODULE:
        return
    record = getattr(p, "collective", None)   # a probe without it records modules only
    if record is not None:
        record(op, _group_name(group), out, phase, mb)


def _group_name(group: Any) -> str:
    if group is None:
        return "world"
    if isinstance(group, str):
        return group
    name = getattr(group, "group_desc", None) or "group"
    return "world" if name == "default_pg" else str(name)
