"""One way to open the durable SQLite files (data plane and capture ledger).

WAL journal, ``synchronous=FULL`` (a commit is on disk when it returns),
autocommit mode (callers use explicit ``BEGIN IMMEDIATE`` transactions), a
30 s busy timeout for cross-process writers, the schema applied idempotently.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path


def open_durable(path: str | os.PathLike[str], schema: str) -> sqlite3.Connection:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA busy_timeout=30000")
    db.executescript(schema)
    return db
