"""Recording collectives issued by any library, via a TorchDispatchMode.

Every c10d collective (``torch.distributed.all_reduce``, megatron-core's
calls, functional collectives, ...) passes the dispatcher as a ``c10d.*`` or
``_c10d_functional.*`` op. A dispatch mode entered on a thread sees them all
for that thread, with the process group among the arguments; its
``group_desc`` (the ``group_desc=`` given to ``new_group``; ``default_pg`` for
the world) names the group's kind.

Entries are ``[op, group_kind, dtype, numel]``: ``op`` is the
``torch.distributed`` API name where one is known (``all_reduce``, ...), else
the c10d op name; ``dtype`` / ``numel`` describe the op's first tensor
argument (summed over a tensor list). No addresses, ids or timings, so
entries are identical across reruns.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional")
# c10d op name -> torch.distributed API name.
OP_NAMES: dict[str, str] = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce_coalesced",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather_into_tensor",
    "allgather_coalesced_": "all_gather_coalesced",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all_single",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv_any_source",
    "barrier": "barrier",
    "monitored_barrier_": "monitored_barrier",
    # functional collectives
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
}
IGNORED_OPS = frozenset({"wait_tensor", "_wrap_tensor_autograd"})  # bookkeeping, not collectives


def _group_kind(args: tuple[Any, ...], kwargs: dict[str, Any], namespace: str) -> str:
    """``group_desc`` of the process group among the op's arguments (or ``unknown``)."""
    c10d = torch._C._distributed_c10d
    values = list(args) + list(kwargs.values())
    for value in values:
        pg = None
        if isinstance(value, c10d.ProcessGroup):
            pg = value
        elif isinstance(value, torch.ScriptObject):
            try:
                pg = c10d.ProcessGroup.unbox(value)
            except Exception:  # some other TorchScript object (e.g. ReduceOp)
                pg = None
        if pg is not None:
            return str(getattr(pg, "group_desc", "") or getattr(pg, "group_name", "unknown"))
    if namespace == "_c10d_functional":
        # functional collectives name their group as a string (the group_name)
        for value in values:
            if isinstance(value, str):
                try:
                    pg = c10d._resolve_process_group(value)
                except Exception:
                    continue
                return str(pg.group_desc or pg.group_name)
    return "unknown"


def _first_tensor(args: tuple[Any, ...]) -> tuple[str, int]:
    """(dtype name, element count) of the first tensor or tensor-list argument."""
    for value in args:
        if isinstance(value, torch.Tensor):
            return str(value.dtype).removeprefix("torch."), int(value.numel())
        if isinstance(value, (list, tuple)) and value:
            flat: list[torch.Tensor] = []
            for item in value:
                if isinstance(item, torch.Tensor):
                    flat.append(item)
                elif isinstance(item, (list, tuple)):
                    flat.extend(t for t in item if isinstance(t, torch.Tensor))
            if flat:
                return str(flat[0].dtype).removeprefix("torch."), int(sum(t.numel() for t in flat))
    return "none", 0


class CollectiveRecorder(TorchDispatchMode):
    """Appends ``[op, group_kind, dtype, numel]`` for every collective on this thread.

    Use ``start()`` / ``stop()`` (or ``with``); both must run on the same
    thread, because dispatch modes are thread-local. Non-collective ops pass
    through untouched (one namespace check per op).
    """

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[list[Any]] = []
        self._thread: int | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        namespace = func.namespace
        if namespace in COLLECTIVE_NAMESPACES:
            name = func._schema.name.split("::", 1)[-1]
            if name not in IGNORED_OPS:
                dtype, numel = _first_tensor(args)
                self.entries.append([OP_NAMES.get(name, name), _group_kind(args, kwargs, namespace), dtype, numel])
        return func(*args, **kwargs)

    @property
    def active(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("collective recorder already started")
        self.__enter__()
        self._thread = threading.get_ident()

    def stop(self) -> list[list[Any]]:
        """Leave the mode; returns the entries recorded since ``start``."""
        if self._thread is None:
            return self.entries
        if self._thread != threading.get_ident():
            raise RuntimeError(
                "collective recorder stopped on a different thread than it was started on "
                "(dispatch modes are per thread)"
            )
        self._thread = None
        self.__exit__(None, None, None)
        return self.entries
