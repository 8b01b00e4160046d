"""The plain config a ``CaptureSink`` is built from (it crosses into Ray actors as a dict).

``capture_config_from_spec`` writes it for a run directory; ``sink_parts`` checks it
and opens what it names: the data plane (a file, or a named ``DataPlaneActor``) and
the ledger. ``CaptureSink.from_config`` is the two together.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.capture.ledger import CaptureLedger

if TYPE_CHECKING:
    from harness.spec.typed import Workload

__all__ = ["CONFIG_KEYS", "capture_config_from_spec", "sink_parts"]

CONFIG_KEYS = frozenset({"ledger_path", "dataplane_path", "dataplane_actor", "dataplane_namespace",
                         "dataplane_local_writes", "ledger_sync", "fail_stage_rate", "seed"})


def capture_config_from_spec(spec: Workload, run_dir: str | Path, *,
                             dataplane_actor: str | None = None) -> dict[str, Any]:
    """The `CaptureSink.from_config` dict for a run directory (design.md layout)."""
    run_dir = Path(run_dir)
    cfg: dict[str, Any] = {
        "ledger_path": str(run_dir / "ledger.sqlite"),
        "fail_stage_rate": spec.capture.fail_stage_rate,
        "seed": spec.seed,
    }
    if dataplane_actor:
        cfg["dataplane_actor"] = dataplane_actor
    else:
        cfg["dataplane_path"] = str(run_dir / "dataplane.sqlite")
    return cfg


def sink_parts(cfg: dict[str, Any]) -> tuple[Any, CaptureLedger, dict[str, Any]]:
    """(data plane, ledger, the sink's keyword arguments) of a config; ``ValueError``
    naming the key for an unknown key, a missing ``ledger_path`` or not exactly one of
    ``dataplane_path`` / ``dataplane_actor``.

    Keys: `ledger_path` (required), exactly one of `dataplane_path` /
    `dataplane_actor` (a named `DataPlaneActor`), optional
    `dataplane_namespace`, `dataplane_local_writes` (None: stage through
    a local connection when on the actor's node; False: always through
    the actor; True: insist), `ledger_sync` ("normal"), `fail_stage_rate`
    (0.0), `seed` (0).
    """
    allowed = set(CONFIG_KEYS)
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ValueError(f"capture sink config: unknown key {unknown[0]!r} (allowed: {sorted(allowed)})")
    if not cfg.get("ledger_path"):
        raise ValueError("capture sink config: 'ledger_path' is required")
    path, actor = cfg.get("dataplane_path"), cfg.get("dataplane_actor")
    if bool(path) == bool(actor):
        raise ValueError("capture sink config: give exactly one of 'dataplane_path' and 'dataplane_actor'")
    if actor:
        from harness.dataplane.actor import DataPlaneClient

        # local_writes=None: on the actor's node the sink stages through its own
        # connection to the same file (no round trip); elsewhere through the actor.
        dataplane: Any = DataPlaneClient(actor, namespace=cfg.get("dataplane_namespace"),
                                         local_writes=cfg.get("dataplane_local_writes"))
    else:
        from harness.dataplane.staging_db import StagingDB

        dataplane = StagingDB(path)
    return dataplane, CaptureLedger(cfg["ledger_path"]), {"fail_stage_rate": cfg.get("fail_stage_rate", 0.0),
                                                          "seed": cfg.get("seed", 0),
                                                          "ledger_sync": cfg.get("ledger_sync", "normal")}
