"""Deterministic reference counts after gloo collectives.

Autograd chooses between in-place and out-of-place work by reference count:
the engine's input buffer sums two gradients with ``add_`` when one of them is
referenced only by the buffer and with ``add`` otherwise, and AccumulateGrad
steals a gradient referenced once but clones a shared one. gloo runs each
collective on a worker thread that wakes the caller *before* it drops its own
references to the tensors, so for a moment after a collective returns its
tensors are referenced 2-4 times (measured on this box: ~30% of
``all_to_all_single`` calls, 2 ranks). Whether autograd meets a gradient in
that moment depends on thread scheduling, so on a busy machine one
``aten::add_`` of a training step became an ``aten::add`` on a random rank and
step: a golden's operator surface changed between reruns of the same code.

:func:`install` wraps the blocking collectives of ``torch.distributed`` (and
so every library calling them through the module, megatron-core included):
after a call with CPU tensors it waits until each tensor argument is back to
the reference count it had before the call. :func:`wait_released` does the
same for asynchronous sends and receives once their works are waited for and
dropped (harness.parallel.pipeline), and it wraps the functional collectives'
``wait_tensor`` (``torch.distributed._functional_collectives``, what DTensor's
redistributes wait on: the tensor-parallel all-reduces and all-gathers of
``policy.backend: dtensor``), which reach gloo through the dispatcher and so
bypass the ``torch.distributed`` functions. FSDP2's all-gathers and
reduce-scatters are blocking ``torch.distributed`` calls on CPU
(``all_gather_single`` / ``reduce_scatter_single``), covered by the first
wrapper. The wait is usually a few microseconds;
it is bounded (:data:`TIMEOUT_S`, then one warning and the run goes on, as
before). CUDA tensors are left alone: NCCL works keep their tensors until the
work is reaped, by design, and no CUDA golden has more than one rank.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0

# Blocking collectives and point-to-point calls (each takes async_op or blocks).
WRAPPED = (
    "all_reduce", "all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single",
    "all_to_all_single", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "scatter", "gather",
    "send", "recv", "_all_gather_base", "_reduce_scatter_base",
)

_lock = threading.Lock()
_installed = False
_warned = False

# Per process: calls that had to wait, the longest wait, and waits that gave up (a tensor
# kept a reference past TIMEOUT_S: a new persistent reference somewhere, worth a look).
stats = {"waited": 0, "max_wait_s": 0.0, "timeouts": 0}


def cpu_tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    """CPU tensors among ``values`` and inside list/tuple values (a collective's tensor arguments)."""
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return [t for t in found if t.device.type == "cpu"]


def use_counts(tensors: Sequence[torch.Tensor]) -> list[int]:
    return [t._use_count() for t in tensors]


def wait_released(tensors: Sequence[torch.Tensor], baseline: Sequence[int], timeout_s: float = TIMEOUT_S) -> bool:
    """Wait until every tensor is referenced no more than its ``baseline``; False if that timed out."""
    return _wait_until(lambda: all(t._use_count() <= n for t, n in zip(tensors, baseline)), timeout_s)


def _wait_until(done: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> bool:
    """Spin (yielding) until ``done()``; count the wait in :data:`stats`; False (one warning) on timeout."""
    global _warned
    if done():
        return True
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > timeout_s:
            stats["timeouts"] += 1
            if not _warned:
                _warned = True
                log.warning("a collective's tensor was still referenced %.1f s after the call returned; "
                            "autograd's in-place choices may differ between reruns", timeout_s)
            return False
        time.sleep(0)  # lets the backend's thread run (gloo's threads do not need the GIL)
    stats["waited"] += 1
    stats["max_wait_s"] = max(stats["max_wait_s"], time.monotonic() - start)
    return True


def _async_index(fn: Callable[..., Any]) -> int | None:
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("async_op") if "async_op" in names else None


def settled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a blocking torch.distributed call) that returns only once the backend let go of its tensors."""
    async_at = _async_index(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        is_async = kwargs.get("async_op", False) or (async_at is not None and len(args) > async_at and args[async_at])
        if is_async:
            return fn(*args, **kwargs)
        tensors = cpu_tensors([*args, *kwargs.values()])
        baseline = use_counts(tensors)
        result = fn(*args, **kwargs)
        wait_released(tensors, baseline)
        return result

    call.__harness_settled__ = True  # type: ignore[attr-defined]
    return call


def settled_wait(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fn`` (funcol's ``wait_tensor``) that returns only once gloo's work let go of the tensor.

    A functional collective's output is a fresh tensor that only its caller (one
    Python object, one reference) and the collective's work hold; the work lets go
    when gloo's worker thread releases it. So the tensor is settled once it is
    referenced once. A tensor that something else holds too waits :data:`TIMEOUT_S`
    and counts a timeout (``suites.local_world`` fails a test world on one)."""

    @functools.wraps(fn)
    def call(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            return fn(tensor)
        result = fn(tensor)
        _wait_until(lambda: tensor._use_count() <= 1)
        return result

    call.__harness_settled__ = True  # type: ignore[attr-defined]
    return call


def install() -> int:
    """Wrap :data:`WRAPPED` in ``torch.distributed`` and funcol's ``wait_tensor`` once per
    process; returns how many ``torch.distributed`` functions are wrapped."""
    global _installed
    with _lock:
        if not _installed:
            for name in WRAPPED:
                fn = getattr(dist, name, None)
                if callable(fn) and not getattr(fn, "__harness_settled__", False):
                    setattr(dist, name, settled(fn))
            from torch.distributed import _functional_collectives as funcol

            if not getattr(funcol.wait_tensor, "__harness_settled__", False):
                funcol.wait_tensor = settled_wait(funcol.wait_tensor)
            _installed = True
    return sum(1 for name in WRAPPED if getattr(getattr(dist, name, None), "__harness_settled__", False))
