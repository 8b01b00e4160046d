"""The data plane as a named Ray actor, and a blocking client for it.

`DataPlaneActor` owns one `StagingDB`: the data plane's address in the
cluster, and the writer for clients on other nodes. Clients on the actor's
node may read, and (opt-in) stage rows, through their own connection to the
same file (see `DataPlaneClient`). `DataPlaneClient` exposes the
store's methods with the same signatures; each call blocks (on `ray.get` or
the local commit), so `client.stage(...)` / `client.stage_many(...)`
returning still means "durable". Prefer the batch methods (`stage_many`, `fetch_many`): one round
trip to the actor costs about a millisecond on a small box. Use
`start_dataplane_actor(name, path)` from the driver and `DataPlaneClient(name)`
anywhere in the cluster (Ray actors, engine processes attached to Ray).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from harness.dataplane.staging_db import StagingDB


@ray.remote(num_cpus=0)
class DataPlaneActor:
    """Ray actor wrapper around `StagingDB(path)`; methods mirror the store.

    Without a path it serves nothing until :meth:`open`; after :meth:`close` it may
    :meth:`open` another file (the warm runtime's pooled data-plane process,
    ``harness.runner.warm``: one process serves the workloads of a gate run one after the
    other, each its own new file). A call while no file is open raises, naming the method."""

    def __init__(self, path: str | None = None):
        import torch

        torch.set_num_threads(1)
        self._store: StagingDB | None = StagingDB(path) if path is not None else None

    def _db(self, method: str) -> StagingDB:
        if self._store is None:
            raise RuntimeError(f"data plane actor: {method} while no staging file is open (closed, or never opened)")
        return self._store

    def open(self, path: str) -> str:
        """Serve a new `StagingDB(path)`; refused while another file is open. Returns its path."""
        if self._store is not None:
            raise RuntimeError(f"data plane actor still serves {self._store.path}; close it before opening {path}")
        from harness.footprint import recorder

        recorder.bind(Path(path).resolve().parent)  # the run's folder (harness.footprint)
        self._store = StagingDB(path)
        return str(self._store.path)

    def path(self) -> str:
        return str(self._db("path").path)

    def location(self) -> tuple[str, str]:
        """(the SQLite file, the Ray node id this actor runs on)."""
        return str(self._db("location").path), ray.get_runtime_context().get_node_id()

    def stage(self, key: str, row: Mapping[str, Any]) -> str:
        return self._db("stage").stage(key, row)

    def stage_many(self, items: list[tuple[str, Mapping[str, Any]]]) -> list[str | Exception]:
        return self._db("stage_many").stage_many(items)

    def fetch(self, key: str) -> dict[str, Any]:
        return self._db("fetch").fetch(key)

    def fetch_many(self, keys: list[str]) -> list[dict[str, Any]]:
        return self._db("fetch_many").fetch_many(keys)

    def digest(self, key: str) -> str | None:
        return self._db("digest").digest(key)

    def has(self, key: str) -> bool:
        return self._db("has").has(key)

    def keys(self, prefix: str = "") -> list[str]:
        return self._db("keys").keys(prefix)

    def put_tensors(self, key: str, tensors: Mapping[str, Any]) -> str:
        return self._db("put_tensors").put_tensors(key, tensors)

    def get_tensors(self, key: str) -> dict[str, Any]:
        return self._db("get_tensors").get_tensors(key)

    def tensor_keys(self, prefix: str = "") -> list[str]:
        return self._db("tensor_keys").tensor_keys(prefix)

    def delete_prefix(self, prefix: str) -> int:
        return self._db("delete_prefix").delete_prefix(prefix)

    def snapshot(self, dest: str) -> None:
        self._db("snapshot").snapshot(dest)

    def close(self) -> None:
        """Close the open file, if any (idempotent); :meth:`open` may then serve another."""
        store, self._store = self._store, None
        if store is not None:
            store.close()


def start_dataplane_actor(name: str, path: str, *, namespace: str | None = None) -> Any:
    """Start (or reuse) the named data-plane actor over the SQLite file `path`."""
    handle = DataPlaneActor.options(name=name, namespace=namespace, get_if_exists=True).remote(str(path))
    actual = ray.get(handle.path.remote())
    if actual != str(path):
        raise ValueError(f"data plane actor {name!r} already serves {actual}, not {path}")
    return handle


class DataPlaneClient:
    """Blocking client with `StagingDB`'s interface, over a Ray actor.

    `target` is an actor handle or the actor's registered name.

    Local connection: when the client runs on the actor's node it can open
    its own connection to the same SQLite file (decided on first use: the
    actor reports its file and node). The staging DB's contract is the file's, not
    the process's -- WAL, `synchronous=FULL`, `BEGIN IMMEDIATE` transactions
    (SQLite serialises writers across processes; `busy_timeout` waits), the
    digest computed from the canonical bytes and re-verified on every read --
    so a local call gives exactly the result the actor would, minus the round
    trip.

    * Row reads (`fetch`, `fetch_many`, `digest`, `has`, `keys`):
      `local_reads=None` (default) uses the local connection when possible;
      `True` insists (raises naming the file and nodes if impossible);
      `False` always asks the actor. In WAL mode a reader sees every
      transaction committed before the read starts, so a row whose `stage`
      returned is visible.
    * Row writes (`stage`, `stage_many`): `local_writes=False` (default) sends
      them to the actor; `None` writes locally when possible (the engine
      owner's capture sink does: its group commit then pays no round trip);
      `True` insists. Either way the call returns after the durable commit.
    * Tensors, `delete_prefix` and `snapshot` always go to the actor.
    """

    def __init__(self, target: Any, *, namespace: str | None = None, local_reads: bool | None = None,
                 local_writes: bool | None = False):
        self._actor = ray.get_actor(target, namespace=namespace) if isinstance(target, str) else target
        self._local_reads = local_reads
        self._local_writes = local_writes
        self._local: StagingDB | None = None
        self._local_checked = False
        self._where: tuple[str, str, str] = ("?", "?", "?")

    def __reduce__(self) -> tuple[Any, ...]:
        # A client travels as its actor handle; the receiver opens its own connection.
        return (_rebuild_client, (self._actor, self._local_reads, self._local_writes))

    @property
    def handle(self) -> Any:
        """The actor handle (pass it to other actors; they wrap it in their own client)."""
        return self._actor

    def _local_store(self, want: bool | None, what: str) -> StagingDB | None:
        """The local connection for `what` (reads/writes) under the setting `want`, or None."""
        if want is False:
            return None
        if not self._local_checked:
            self._local_checked = True
            path, node = ray.get(self._actor.location.remote())
            here = ray.get_runtime_context().get_node_id()
            self._where = (path, node, here)
            if node == here and Path(path).is_file():
                self._local = StagingDB(path)
        if self._local is None and want:
            path, node, here = self._where
            raise ValueError(f"data plane client: local_{what}=True but the store {path} is on node {node} "
                             f"and this process runs on node {here}")
        return self._local

    def _rows(self) -> StagingDB | None:
        """The local connection for row reads, or None (reads go to the actor)."""
        return self._local_store(self._local_reads, "reads")

    def _writer(self) -> StagingDB | None:
        """The local connection for row writes, or None (writes go to the actor)."""
        return self._local_store(self._local_writes, "writes")

    def close(self) -> None:
        """Close the local connection (the actor keeps running); reopened on the next local call."""
        if self._local is not None:
            self._local.close()
            self._local = None
        self._local_checked = False

    def stage(self, key: str, row: Mapping[str, Any]) -> str:
        local = self._writer()
        return local.stage(key, row) if local is not None else ray.get(self._actor.stage.remote(key, dict(row)))

    def stage_many(self, items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str | Exception]:
        """One transaction for the whole batch (see `StagingDB.stage_many`):
        on the local connection, or in one actor round trip."""
        local = self._writer()
        if local is not None:
            return local.stage_many(items)
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


def _rebuild_client(actor: Any, local_reads: bool | None, local_writes: bool | None = False) -> DataPlaneClient:
    return DataPlaneClient(actor, local_reads=local_reads, local_writes=local_writes)
