"""Where a cold run's Ray comes from: a private local instance, or an existing cluster.

* ``address`` None: ``ray.init(address="local")``, a fresh one-node instance this
  run starts and shuts down (``RAY_ADDRESS`` is not followed); its logical CPUs
  are the machine's cores plus one per planned device slot, so the run's
  placement group (``harness.runner.placement``) always fits.
* ``address`` given (``--ray-address``, ``platform.ray_address``, the pytest
  plugin's ``--golden-ray-address``): the run joins that cluster as a driver
  (its job ``runtime_env`` as usual) and at the end only disconnects
  (``ray.shutdown()`` of a driver that joined stops nothing of the cluster).

``preflight(spec, topology, address)`` refuses, before the run directory or any
process exists, a plan the cluster at ``address`` cannot hold (``capacity.ClusterRefused``, exit 2):
it connects, reads the alive nodes, checks (``capacity.assign_nodes``) and disconnects.
"""

from __future__ import annotations

import os

import ray

from harness.runner import capacity
from harness.spec.typed import Workload


def node_views() -> list[capacity.NodeView]:
    """The connected cluster's nodes as the capacity rules see them."""
    out = []
    for n in ray.nodes():
        res = n.get("Resources", {})
        out.append(capacity.NodeView(node_id=n["NodeID"], address=str(n.get("NodeManagerAddress", "?")),
                                     cpus=float(res.get("CPU", 0.0)), gpus=float(res.get("GPU", 0.0)),
                                     alive=bool(n.get("Alive")), labels=dict(n.get("Labels") or {})))
    return out


def driver_node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def local_cpus(spec: Workload) -> int:
    """Logical CPUs of a private local instance: the cores plus the plan's slot CPUs
    (``spec``: the plan's typed workload)."""
    slots = int(spec.platform.gpus_per_node) * int(capacity.SLOT_CPU)
    return max(2, os.cpu_count() or 2) + slots


def init_ray(spec: dict, address: str | None, **kwargs) -> None:
    """Start the private local instance (``address`` None) or join ``address``."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if address is None:
        # address="local": always a fresh local instance. Without it ray.init follows
        # RAY_ADDRESS to an existing cluster and then refuses num_cpus.
        from harness.runner.ray_start import local_start

        with local_start(bool(kwargs.get("log_to_driver", True))):
            ray.init(address="local", num_cpus=local_cpus(spec), include_dashboard=False, **kwargs)
    else:
        probe(address)
        from harness.runner.ray_start import driver_harness_first

        try:
            with driver_harness_first():
                ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise capacity.ClusterRefused(f"cannot join the Ray cluster at {address}: {exc}") from None


PROBE_TIMEOUT_S = 5.0


def probe(address: str) -> None:
    """A ``HOST:PORT`` address must accept a TCP connection (Ray's own join waits minutes
    for a GCS that is not there); other forms (``auto``, ``ray://...``) go to Ray as given."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdecimal() or "/" in address:
        return
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise capacity.ClusterRefused(f"cannot join the Ray cluster at {address}: nothing accepts connections "
                                      f"there ({type(exc).__name__}: {exc}); is the head node up "
                                      "(ray start --head)?") from None


def preflight(spec: dict, topology: dict, address: str) -> None:
    """Refuse (``ClusterRefused``) a plan the cluster at ``address`` cannot hold; starts nothing
    that stays. (A private local instance is one node: ``capacity.local_refusal``.)"""
    capacity.check_engines(topology)
    capacity.check_distill(topology)
    if ray.is_initialized():
        raise capacity.ClusterRefused(f"cannot join {address}: this process is already connected to a Ray instance")
    init_ray(spec, address, log_to_driver=False)
    try:
        capacity.assign_nodes(spec, topology, node_views(), driver_node=driver_node_id(),
                              where=f"ray cluster {address}")
    finally:
        ray.shutdown()  # a joined driver disconnects; the cluster keeps running
