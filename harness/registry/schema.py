"""The workload schema's name enums, generated from the registries (stdlib only).

``harness.spec.schema.load_schema`` writes :data:`SCHEMA_ENUMS` into the schema it
validates with, so a name is valid exactly when a registry entry has it; the copies in
``workload.schema.json`` are for readers of the file, and
``suites/unit/test_registries.py`` fails when they drift from these.
"""

from __future__ import annotations

from harness.registry import policy, refit, rollout, trainer

# {property path in the schema: names, in registry order}; ``rollout.refit.transport``
# starts with ``auto`` (resolved from the placement, no entry of its own).
SCHEMA_ENUMS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("policy", "backend"): tuple(policy.POLICY_BACKENDS),
    ("rollout", "backend"): tuple(rollout.ROLLOUT_BACKENDS),
    ("grpo", "trainer"): tuple(trainer.TRAINERS),
    ("rollout", "refit", "transport"): (refit.AUTO, *refit.names()),
}
