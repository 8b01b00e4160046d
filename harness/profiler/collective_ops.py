"""What a recorded collective is: the ops counted and the entry one call makes.

``entry(name, namespace, args, kwargs)`` is ``[op, group_kind, dtype, numel]``:
``op`` the ``torch.distributed`` API name where one is known (``OP_NAMES``), else
the c10d op name; ``group_kind`` the ``group_desc`` of the process group among the
arguments; ``dtype`` / ``numel`` the first tensor argument's (summed over a tensor
list). Both recording methods (``harness.profiler.collectives``) build entries here and
share ``RecorderThread`` (the thread a recorder was started on).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["COLLECTIVE_NAMESPACES", "IGNORED_OPS", "OP_NAMES", "RecorderThread", "entry"]

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
OP_NAMES.update({
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced_": "all_reduce_coalesced",
    "all_gather_into_tensor_out": "all_gather_into_tensor",
    "reduce_scatter_tensor_out": "reduce_scatter_tensor",
    "isend": "isend",
    "irecv": "irecv",
    "batch_p2p_ops": "batch_isend_irecv",
})
# bookkeeping, not collectives
IGNORED_OPS = frozenset({"wait_tensor", "_wrap_tensor_autograd", "check_for_nan"})


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
            except Exception:  # noqa: BLE001 - some other TorchScript object (e.g. ReduceOp)
                pg = None
        if pg is not None:
            return str(getattr(pg, "group_desc", "") or getattr(pg, "group_name", "unknown"))
    if namespace == "_c10d_functional":
        # functional collectives name their group as a string (the group_name)
        for value in values:
            if isinstance(value, str):
                try:
                    pg = c10d._resolve_process_group(value)
                except Exception:  # noqa: BLE001 - not a resolvable group name
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


def entry(name: str, namespace: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """``[op, group_kind, dtype, numel]`` of one collective call (the module docstring of
    ``harness.profiler.collectives`` says what each field holds)."""
    dtype, numel = _first_tensor(args)
    return [OP_NAMES.get(name, name), _group_kind(args, kwargs, namespace), dtype, numel]


class RecorderThread:
    """What both recorders share: ``_thread``, the thread ``start`` ran on (None when
    stopped; ``active`` between ``start`` and ``stop``), and the refusal of a second start."""

    _thread: int | None = None

    @property
    def active(self) -> bool:
        return self._thread is not None

    def _refuse_if_started(self) -> None:
        if self._thread is not None:
            raise RuntimeError("collective recorder already started")
