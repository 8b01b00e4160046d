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
  torch (``collectives_mode.py``).

This module holds the kernel method, the method choice and ``CollectiveRecorder``;
the entry of a call and the ops that count are ``collective_ops.py``'s.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Self

import torch

from harness.profiler.collective_ops import COLLECTIVE_NAMESPACES, IGNORED_OPS, RecorderThread, entry
from harness.profiler.collectives_mode import ModeCollectiveRecorder

METHOD_ENV = "HARNESS_TRACE_COLLECTIVES"
METHODS = ("kernel", "mode")
_TLS_KEY = "harness.profiler.collective_recorders"


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
                recorded = entry(name, namespace, args, kwargs)
                for recorder in recorders:
                    recorder.entries.append(list(recorded))
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


class KernelCollectiveRecorder(RecorderThread):
    """Appends ``[op, group_kind, dtype, numel]`` for every collective issued in this thread's state.

    ``start()`` / ``stop()`` (or ``with``) on the same thread; stopping on
    another thread still stops recording but raises (the entries are kept).
    """

    method = "kernel"

    def __init__(self) -> None:
        self.entries: list[list[Any]] = []
        self.recording = False
        self._thread: int | None = None

    def start(self) -> None:
        self._refuse_if_started()
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
