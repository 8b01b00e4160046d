"""The golden store: ``goldens/<workload>/<platform>/`` with atomic writes, provenance and lint.

``write_golden`` / ``read_golden`` keep the invariant that a golden directory is
always complete (see ``atomic``); ``lint`` checks that scheduled workload x platform
pairs and stored goldens match. No torch, no ray.
"""

from harness.store.atomic import (
    Golden,
    GoldenStoreError,
    read_golden,
    read_golden_dir,
    recover,
    write_golden,
)
from harness.store.lint import LintFinding, lint, scheduled_platforms
from harness.store.provenance import PROVENANCE_FIELDS, new_provenance, provenance_errors

__all__ = ["Golden", "GoldenStoreError", "read_golden", "read_golden_dir", "recover", "write_golden",
           "LintFinding", "lint", "scheduled_platforms", "PROVENANCE_FIELDS", "new_provenance",
           "provenance_errors"]
