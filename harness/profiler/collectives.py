"""Recording collectives issued by any library, at the dispatcher.

Every c10d collective (``torch.distributed.all_reduce``, megatron-core's
calls, functional collectives, ...) passes the dispatcher as a ``c10d.*`` or
``_c10d_functional.*`` op, with the process group among the arguments; its
``group_desc`` (the ``group_desc=`` given to ``new_group``; ``default_pg`` for
the world) names the group's kind.

Entries are ``[op, group_kind, dtype, numel]``: ``op`` is the
``torch.distributed`` API name where one is known (``all_reduce``, ...), else
the c10d op name; ``dtype`` / ``numel`` describe the op's first tensor
argument (summed over a tensor list). No addresses, ids or timings, so
entries are identical across reruns. Only the outermost collective is
recorded (a functional ``all_reduce`` is one entry, not also the
``c10d::allreduce_`` it runs).

Two interception methods (``HARNESS_TRACE_COLLECTIVES``):

* ``kernel`` (default): at the first recorder start in a process, a Python
  kernel is registered for every collective op at the ``BackendSelect``
  dispatch key (always in the dispatch key set, also under inference mode;
  collective ops have no kernel of their own there). It records when a
  recorder is active in the calling thread's state, then redispatches to the
  op's real kernel with ``OpOverload.redispatch``, which releases the GIL
  while the kernel runs, exactly as a plain call does (running the real kernel
  with the GIL held can deadlock against gloo's worker threads, which may need
  the GIL to free a tensor while holding the work-queue lock). Non-collective
  ops pay nothing; a collective pays one Python call (~10 us). The active
  recorders live in torch's thread-local Python object stash, which
  ``at::ThreadLocalState`` carries into autograd threads, like a dispatch mode.
  (torch 2.11's stash steals the caller's reference and has no removal;
  ``_stash`` measures that once and compensates, so the kernel method also
  runs there: the ``mode`` fallback had cost 1.69x on a GPU training step.)
  Ops on meta tensors (shape tracing) are not recorded.
* ``mode``: a ``TorchDispatchMode`` entered on the calling thread (the original
  method). Every op of the window then makes a Python round trip (~4 us; 3.5x
  on the smoke workload's generation), so it is only the fallback for older
  torch.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Self

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

METHOD_ENV = "HARNESS_TRACE_COLLECTIVES"
METHODS = ("kernel", "mode")
_TLS_KEY = "harness.profiler.collective_recorders"


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


def _entry(name: str, namespace: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    dtype, numel = _first_tensor(args)
    return [OP_NAMES.get(name, name), _group_kind(args, kwargs, namespace), dtype, numel]


def kernel_method_available() -> bool:
    """Whether this torch can take the kernel method (Python kernels with keysets, TLS object stash)."""
    return hasattr(torch._C, "_dispatch_keyset_full_after") and all(
        hasattr(torch._C, f) for f in ("_stash_obj_in_tls", "_get_obj_in_tls", "_is_key_in_tls")
    )


def resolve_method(environ: dict[str, str] | None = None) -> str:
    """``kernel`` or ``mode`` from ``HARNESS_TRACE_COLLECTIVES`` (default: kernel where available)."""
    env = os.environ if environ is None else environ
    raw = env.get(METHOD_ENV, "").strip().lower()
    if raw and raw not in METHODS:
        raise ValueError(f"{METHOD_ENV}={raw!r}: expected one of {', '.join(METHODS)}")
    if raw == "mode" or not kernel_method_available():
        return "mode"
    return "kernel"


# -- kernel method ---------------------------------------------------------------------

_install_lock = threading.Lock()
_libraries: list[Any] = []  # torch.library.Library objects; kept alive for the process
_installed: int | None = None  # number of wrapped ops once installed
_nesting = threading.local()


_stash_steals: bool | None = None  # whether torch's TLS stash steals the reference it is given


def _stash_steals_reference() -> bool:
    """Whether ``torch._C._stash_obj_in_tls`` takes over the caller's reference.

    Older torch (seen on 2.11) wraps the borrowed object in a ``SafePyObject``
    without a new reference, so the stash later releases a reference it never
    took and the object is freed while still stashed. Measured once with a
    probe object that is given an extra reference first, so either way no
    object is ever over-released.
    """
    global _stash_steals
    if _stash_steals is None:
        import ctypes
        import sys

        probe = object()
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(probe))  # the reference a stealing stash takes over
        before = sys.getrefcount(probe)
        key = _TLS_KEY + ".probe"
        torch._C._stash_obj_in_tls(key, probe)
        steals = sys.getrefcount(probe) == before
        if not steals:
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(probe))
        _stash_steals = steals
        _stash(key, ())  # the probe leaves the stash (through the same rule as every later value)
    return _stash_steals


def _stash(key: str, value: Any) -> None:
    """``_stash_obj_in_tls`` that leaves the caller's reference intact on every torch."""
    if _stash_steals:
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(value))
    torch._C._stash_obj_in_tls(key, value)


def _active_recorders() -> tuple[KernelCollectiveRecorder, ...]:
    if torch._C._is_key_in_tls(_TLS_KEY):
        return torch._C._get_obj_in_tls(_TLS_KEY)
    return ()


def _set_active_recorders(recorders: tuple[KernelCollectiveRecorder, ...]) -> None:
    _stash_steals_reference()
    if recorders:
        _stash(_TLS_KEY, recorders)
    elif torch._C._is_key_in_tls(_TLS_KEY):
        remove = getattr(torch._C, "_remove_obj_from_tls", None)
        if remove is not None:
            remove(_TLS_KEY)
        else:  # torch without removal (2.11): an empty tuple means "none active"
            _stash(_TLS_KEY, ())


def _is_meta(args: tuple[Any, ...]) -> bool:
    for value in args:
        if isinstance(value, torch.Tensor):
            return value.is_meta
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return value[0].is_meta
    return False


def _make_kernel(op: Any, name: str, namespace: str):
    # Everything below BackendSelect: the op's real (backend or composite) kernel.
    below = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect).remove(
        torch._C.DispatchKey.PythonDispatcher
    )
    redispatch = op.redispatch  # releases the GIL while the kernel runs, like a plain call

    def kernel(keyset, *args, **kwargs):
        if not getattr(_nesting, "depth", 0):
            recorders = [r for r in _active_recorders() if r.recording]
            if recorders and not _is_meta(args):
                entry = _entry(name, namespace, args, kwargs)
                for recorder in recorders:
                    recorder.entries.append(list(entry))
                _nesting.depth = 1  # collectives run by this one are not issued by the caller
                try:
                    return redispatch(keyset & below, *args, **kwargs)
                finally:
                    _nesting.depth = 0
        return redispatch(keyset & below, *args, **kwargs)

    return kernel


def install_kernels() -> int:
    """Register the recording kernel for every collective op (once per process); returns how many."""
    global _installed
    with _install_lock:
        if _installed is not None:
            return _installed
        import torch.distributed  # registers the c10d ops

        wrapped = 0
        for namespace in COLLECTIVE_NAMESPACES:
            lib = torch.library.Library(namespace, "IMPL")
            names = {n.split("::", 1)[1].split(".", 1)[0] for n in torch._C._dispatch_get_all_op_names()
                     if n.startswith(f"{namespace}::")}
            for packet_name in sorted(names - IGNORED_OPS):
                packet = getattr(getattr(torch.ops, namespace), packet_name)
                for overload_name in packet.overloads():
                    op = getattr(packet, overload_name)
                    schema = op._schema
                    qualname = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
                    if torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "BackendSelect"):
                        continue  # not expected for collectives; never replace someone's kernel
                    lib.impl(op, _make_kernel(op, packet_name, namespace), "BackendSelect", with_keyset=True)
                    wrapped += 1
            _libraries.append(lib)
        _installed = wrapped
        return wrapped


class KernelCollectiveRecorder:
    """Appends ``[op, group_kind, dtype, numel]`` for every collective issued in this thread's state.

    ``start()`` / ``stop()`` (or ``with``) on the same thread; stopping on
    another thread still stops recording but raises (the entries are kept).
    """

    method = "kernel"

    def __init__(self) -> None:
        self.entries: list[list[Any]] = []
        self.recording = False
        self._thread: int | None = None

    @property
    def active(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("collective recorder already started")
        install_kernels()
        self.recording = True
        self._thread = threading.get_ident()
        _set_active_recorders(tuple(r for r in _active_recorders() if r.recording) + (self,))

    def stop(self) -> list[list[Any]]:
        """Stop recording; returns the entries recorded since ``start``."""
        if self._thread is None:
            return self.entries
        self.recording = False
        thread, self._thread = self._thread, None
        _set_active_recorders(tuple(r for r in _active_recorders() if r.recording))
        if thread != threading.get_ident():
            raise RuntimeError(
                "collective recorder stopped on a different thread than it was started on "
                "(recorders are per thread state)"
            )
        return self.entries

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- mode method -------------------------------------------------------------------------


class ModeCollectiveRecorder(TorchDispatchMode):
    """The dispatch-mode method: sees every op of the window (slow), records collectives.

    Use ``start()`` / ``stop()``; both must run on the same thread, because
    dispatch modes are thread-local.
    """

    method = "mode"

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
                self.entries.append(_entry(name, namespace, args, kwargs))
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


def CollectiveRecorder(method: str | None = None) -> KernelCollectiveRecorder | ModeCollectiveRecorder:
    """A recorder using ``method`` (default: :func:`resolve_method`)."""
    method = method or resolve_method()
    if method == "kernel":
        if not kernel_method_available():
            raise RuntimeError(
                "this torch lacks what the kernel method needs (dispatch keyset helpers, TLS object stash)"
            )
        return KernelCollectiveRecorder()
    if method == "mode":
        return ModeCollectiveRecorder()
    raise ValueError(f"unknown collective recording method {method!r}")
