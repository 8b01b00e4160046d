"""Planted capture regressions for the durability and fail-closed tests (issue 23).

Each function patches the process that calls it, through ``set_attr``
(``setattr`` by default; a test passes ``monkeypatch.setattr`` so the patch
is undone after it): the tests call them in process, in a forked writer
child, or in every Ray worker as the runner's worker setup hook
(``GOLDEN_WORKER_SETUP_HOOK=suites.faults.planted.<name>`` with the repository
on ``PYTHONPATH``). The tests that use them assert that the check under test
fails with the mutation in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SetAttr = Callable[[Any, str, Any], None]


def sync_off_around_stage_commit(set_attr: SetAttr = setattr) -> None:
    """The stage commit runs at ``synchronous=OFF`` (no fsync); FULL is restored after it,
    so a pragma read at open or between batches still says FULL."""
    from harness.dataplane.staging_db import StagingDB

    original = StagingDB.stage_many

    def stage_many(self, items):
        self._db.execute("PRAGMA synchronous=OFF")
        try:
            return original(self, items)
        finally:
            self._db.execute("PRAGMA synchronous=FULL")

    set_attr(StagingDB, "stage_many", stage_many)


def ledger_before_stage(set_attr: SetAttr = setattr) -> None:
    """A finish batch writes its ledger outcomes before it stages the rows they point at."""
    from harness.capture.sink import CaptureSink

    def finish_requests(self, finished):
        with self._lock:
            calls = [self._prepare(self._pending.pop(h), out, lp, v) for h, out, lp, v in finished]
            self._commit(calls)
            self._stage(calls)
            return [c.coords() for c in calls]

    set_attr(CaptureSink, "finish_requests", finish_requests)


def stage_returns_before_commit(set_attr: SetAttr = setattr) -> None:
    """``stage_many`` acknowledges every row (its digest) and returns before any commit:
    nothing reaches the data plane, while the ledger records the calls as committed."""
    import hashlib

    from harness.dataplane.staging_db import StagingDB, canonical_row_bytes

    def stage_many(self, items):
        return [hashlib.sha256(canonical_row_bytes(key, row)).hexdigest() for key, row in items]

    set_attr(StagingDB, "stage_many", stage_many)
