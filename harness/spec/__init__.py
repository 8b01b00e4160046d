"""Workload specs and the topology planner (gate half: no torch, no ray).

- ``load_spec(path_or_name, overrides)`` -> a validated, default-filled dict;
- ``plan(spec)`` -> ``Topology`` (every rank's node, device, coords, groups);
- errors are ``SpecError`` / ``TopologyError``, each naming the field.

See docs/spec.md.
"""

from harness.spec.errors import SpecError, TopologyError
from harness.spec.load import (
    apply_overrides,
    default_goldens_root,
    list_workloads,
    load_spec,
    spec_digest,
)
from harness.spec.topology import Topology, coords_of, plan, rank_groups

__all__ = [
    "SpecError",
    "Topology",
    "TopologyError",
    "apply_overrides",
    "coords_of",
    "default_goldens_root",
    "list_workloads",
    "load_spec",
    "plan",
    "rank_groups",
    "spec_digest",
]
