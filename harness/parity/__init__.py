"""Parity: golden vs actual surfaces through an exact and a tolerance lane.

``compare(golden_docs, actual_docs, tolerances=..., deterministic=...) -> Verdict``;
findings name surface, section (rank, coords), phase/step, key, both values, errors,
lane and status (``fail`` / ``stale`` = probable stale golden / ``info``). Renderers in
``harness.parity.render``. No torch, no ray.
"""

from harness.parity.comparison import compare, compare_surface
from harness.parity.findings import Finding, SurfaceResult, Verdict
from harness.parity.tolerances import (
    ToleranceFileError,
    TolerancesFile,
    ToleranceTable,
    load_tolerances,
    parse_tolerances,
)

__all__ = ["compare", "compare_surface", "Finding", "SurfaceResult", "Verdict", "ToleranceFileError",
           "TolerancesFile", "ToleranceTable", "load_tolerances", "parse_tolerances"]
