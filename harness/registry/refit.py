"""``rollout.refit.transport`` -> how a refit moves the weights: the registry and the role's Protocol.

A refit (docs/refit.md) moves the policy's full HF-named weights into every rollout
engine. A transport is one way of doing it, in three halves that run in three kinds
of process: the driver's :class:`~harness.grpo.refitter.Refitter` runs one refit
(:meth:`RefitTransport.refit`), policy rank 0 sends (:meth:`RefitTransport.send`) and
each rollout worker fans the receive out to its engine's TP ranks
(:meth:`RefitTransport.receive_calls`). The transport is chosen once, when the
refitter is built from the plan (:func:`resolve`: ``auto`` picks by placement); its
name then travels with every call (``stream_weights(name, ...)``,
``receive_weights(name, ...)``) and each side looks its entry up here. No code
outside this registry compares transport names (``suites/unit/test_import_graph.py``).

Stdlib only: the implementations (``harness.refit.transport``: torch, pyzmq) are
imported by :func:`refit_transport`, never here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol, runtime_checkable

from harness.registry import load_target

AUTO = "auto"  # rollout.refit.transport: the transport whose ``colocated`` matches rollout.colocated


@runtime_checkable
class RefitTransport(Protocol):
    """One refit transport: the driver's, the sender's and the receivers' halves."""

    name: str

    def refit(self, refitter: Any, phases: dict[str, float]) -> list[int]:
        """Driver: one refit into every engine of ``refitter``; each engine's new weight version
        (``phases``: seconds per phase, filled where the transport measures them)."""
        ...

    def on_device(self, kw: Mapping[str, Any]) -> bool:
        """Policy ranks: whether the sender takes the weights as device tensors (``kw``: the
        send's keywords; the engine must also offer it, ``DEVICE_STATE_DICT``)."""
        ...

    def send(self, worker: Any, items: list[tuple[str, Any]], kw: dict[str, Any], collect_s: float) -> Any:
        """Policy rank 0 (``worker``, a ``PolicyWorker``): send the full weights ``items`` with the
        driver's keywords ``kw``; ``collect_s``: the seconds their gather took (send statistics)."""
        ...

    def receive_calls(self, label: str, tp: int, kw: Mapping[str, Any],
                      default_addresses: Callable[[], list[str]]) -> tuple[str, list[dict[str, Any]]]:
        """Rollout worker: the engine-process method to call and one keyword dict per TP rank
        (``ValueError`` naming ``label`` for keywords that do not fit: nothing is called then)."""
        ...


@dataclass(frozen=True)
class Transport:
    """One ``rollout.refit.transport``: its implementation and when ``auto`` picks it."""

    name: str
    target: str  # "module:Class" implementing RefitTransport, imported by refit_transport()
    colocated: bool  # ``auto`` picks it for colocated engines (True) or separate ones (False)
    note: str = ""


TRANSPORTS: dict[str, Transport] = {t.name: t for t in (
    Transport("zmq", "harness.refit.transport:ZmqTransport", colocated=True,
              note="policy rank 0 streams to each engine TP rank over ZeroMQ (CUDA IPC staging on cuda, "
                   "tcp:// across nodes)"),
    Transport("broadcast", "harness.refit.transport:BroadcastTransport", colocated=False,
              note="a side process group of policy rank 0 and every engine rank, one broadcast per bucket"),
)}


class UnknownTransport(ValueError):
    """A transport name no entry has (the message names the spec field and the known names)."""

    def __init__(self, name: object) -> None:
        known = " or ".join(repr(n) for n in TRANSPORTS)
        super().__init__(f"rollout.refit.transport: refit transport must be {known}, got {name!r}")
        self.name = name


def transport_entry(name: str) -> Transport:
    """The registry entry of transport ``name``; :class:`UnknownTransport` otherwise."""
    try:
        return TRANSPORTS[name]
    except (KeyError, TypeError):
        raise UnknownTransport(name) from None


def resolve(name: str, colocated: bool) -> str:
    """The transport a refit uses for ``rollout.refit.transport`` ``name`` (:data:`AUTO`: the
    entry for ``colocated`` engines or for separate ones); :class:`UnknownTransport` otherwise."""
    if name != AUTO:
        return transport_entry(name).name
    return next(t.name for t in TRANSPORTS.values() if t.colocated is bool(colocated))


def refit_transport(name: str) -> RefitTransport:
    """The implementation of transport ``name`` (its module is imported now);
    :class:`UnknownTransport` for a name no entry has."""
    return _implementation(transport_entry(name).target)


@cache
def _implementation(target: str) -> RefitTransport:
    return load_target(target)()


def names() -> Sequence[str]:
    """Every registered transport, in registry order (the schema's enum after ``auto``)."""
    return tuple(TRANSPORTS)
