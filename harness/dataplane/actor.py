"""The data plane as a named Ray actor, and a blocking client for it.

`DataPlaneActor` owns one `DataPlaneStore` (a single writer process, so SQLite
lock contention never arises between engines). `DataPlaneClient` exposes the
store's methods with the same signatures; each call blocks on `ray.get`, so
`client.stage(...)` / `client.stage_many(...)` returning still means
"durable". Prefer the batch methods (`stage_many`, `fetch_many`): one round
trip to the actor costs about a millisecond on a small box. Use
`start_dataplane_actor(name, path)` from the driver and `DataPlaneClient(name)`
anywhere in the cluster (Ray actors, engine processes attached to Ray).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from harness.dataplane.store import DataPlaneStore


@ray.remote(num_cpus=0)
class DataPlaneActor:
    """Ray actor wrapper around `DataPlaneStore(path)`; methods mirror the store."""

    def __init__(self, path: str):
        import torch

        torch.set_num_threads(1)
        self._store = DataPlaneStore(path)

    def path(self) -> str:
        return str(self._store.path)

    def location(self) -> tuple[str, str]:
        """(the SQLite file, the Ray node id this actor runs on)."""
        return str(self._store.path), ray.get_runtime_context().get_node_id()

    def stage(self, key: str, row: Mapping[str, Any]) -> str:
        return self._store.stage(key, row)

    def stage_many(self, items: list[tuple[str, Mapping[str, Any]]]) -> list[str | Exception]:
        return self._store.stage_many(items)

    def fetch(self, key: str) -> dict[str, Any]:
        return self._store.fetch(key)

    def fetch_many(self, keys: list[str]) -> list[dict[str, Any]]:
        return self._store.fetch_many(keys)

    def digest(self, key: str) -> str | None:
        return self._store.digest(key)

    def has(self, key: str) -> bool:
        return self._store.has(key)

    def keys(self, prefix: str = "") -> list[str]:
        return self._store.keys(prefix)

    def put_tensors(self, key: str, tensors: Mapping[str, Any]) -> str:
        return self._store.put_tensors(key, tensors)

    def get_tensors(self, key: str) -> dict[str, Any]:
        return self._store.get_tensors(key)

    def tensor_keys(self, prefix: str = "") -> list[str]:
        return self._store.tensor_keys(prefix)

    def delete_prefix(self, prefix: str) -> int:
        return self._store.delete_prefix(prefix)

    def snapshot(self, dest: str) -> None:
        self._store.snapshot(dest)

    def close(self) -> None:
        self._store.close()


def start_dataplane_actor(name: str, path: str, *, namespace: str | None = None) -> Any:
    """Start (or reuse) the named data-plane actor over the SQLite file `path`."""
    handle = DataPlaneActor.options(name=name, namespace=namespace, get_if_exists=True).remote(str(path))
    actual = ray.get(handle.path.remote())
    if actual != str(path):
        raise ValueError(f"data plane actor {name!r} already serves {actual}, not {path}")
    return handle


class DataPlaneClient:
    """Blocking client with `DataPlaneStore`'s interface, over a Ray actor.

    `target` is an actor handle or the actor's registered name.

    Writes always go through the actor (one writer process). Row reads
    (`fetch`, `fetch_many`, `digest`, `has`, `keys`) are served from a local
    read connection to the same SQLite file when the client runs on the
    actor's node (`local_reads=None`, the default, decides this on the first
    read; `True` insists and raises naming the file and nodes if impossible;
    `False` always asks the actor). In WAL mode a reader sees every
    transaction committed before the read starts, so a row whose `stage`
    returned is visible, and the stored digest is re-verified on every read
    either way. Tensor reads stay with the actor.
    """

    def __init__(self, target: Any, *, namespace: str | None = None, local_reads: bool | None = None):
        self._actor = ray.get_actor(target, namespace=namespace) if isinstance(target, str) else target
        self._local_reads = local_reads
        self._reader: DataPlaneStore | None = None
        self._reader_checked = local_reads is False

    def __reduce__(self) -> tuple[Any, ...]:
        # A client travels as its actor handle; the receiver opens its own reader.
        return (_rebuild_client, (self._actor, self._local_reads))

    @property
    def handle(self) -> Any:
        """The actor handle (pass it to other actors; they wrap it in their own client)."""
        return self._actor

    def _rows(self) -> DataPlaneStore | None:
        """The local read connection, or None (reads go to the actor)."""
        if not self._reader_checked:
            self._reader_checked = True
            path, node = ray.get(self._actor.location.remote())
            here = ray.get_runtime_context().get_node_id()
            if node == here and Path(path).is_file():
                self._reader = DataPlaneStore(path)
            elif self._local_reads:
                raise ValueError(f"data plane client: local_reads=True but the store {path} is on node {node} "
                                 f"and this process runs on node {here}")
        return self._reader

    def close(self) -> None:
        """Close the local read connection (the actor keeps running)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._reader_checked = self._local_reads is False

    def stage(self, key: str, row: Mapping[str, Any]) -> str:
        return ray.get(self._actor.stage.remote(key, dict(row)))

    def stage_many(self, items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str | Exception]:
        """One actor round trip and one transaction for the whole batch (see `DataPlaneStore.stage_many`)."""
        return ray.get(self._actor.stage_many.remote([(k, r) for k, r in items]))

    def fetch(self, key: str) -> dict[str, Any]:
        rows = self._rows()
        return rows.fetch(key) if rows is not None else ray.get(self._actor.fetch.remote(key))

    def fetch_many(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        rows = self._rows()
        return rows.fetch_many(keys) if rows is not None else ray.get(self._actor.fetch_many.remote(list(keys)))

    def digest(self, key: str) -> str | None:
        rows = self._rows()
        return rows.digest(key) if rows is not None else ray.get(self._actor.digest.remote(key))

    def has(self, key: str) -> bool:
        rows = self._rows()
        return rows.has(key) if rows is not None else ray.get(self._actor.has.remote(key))

    def keys(self, prefix: str = "") -> list[str]:
        rows = self._rows()
        return rows.keys(prefix) if rows is not None else ray.get(self._actor.keys.remote(prefix))

    def put_tensors(self, key: str, tensors: Mapping[str, Any]) -> str:
        return ray.get(self._actor.put_tensors.remote(key, dict(tensors)))

    def get_tensors(self, key: str) -> dict[str, Any]:
        return ray.get(self._actor.get_tensors.remote(key))

    def tensor_keys(self, prefix: str = "") -> list[str]:
        return ray.get(self._actor.tensor_keys.remote(prefix))

    def delete_prefix(self, prefix: str) -> int:
        return ray.get(self._actor.delete_prefix.remote(prefix))

    def snapshot(self, dest: str) -> None:
        ray.get(self._actor.snapshot.remote(str(dest)))


def _rebuild_client(actor: Any, local_reads: bool | None) -> DataPlaneClient:
    return DataPlaneClient(actor, local_reads=local_reads)
