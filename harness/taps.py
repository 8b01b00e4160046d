"""Numerics taps: where the model's code names a module call for the numerics probe.

``call(name, fn, *args, level=...)`` runs ``fn(*args)``. With no probe installed (the
default, and every rollout engine) it is exactly that call and nothing else: no tensor
is copied, no autograd node added, no operator dispatched. With a probe installed
(``harness.policy.numerics_probe``) and ``level`` within its depth, the probe digests the
output in forward and the gradient arriving at it in backward (a tensor hook: no extra
operator either). A leaf: imports nothing of the harness.

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
