"""`pytest -m golden` imports only the test modules that can hold golden tests (suites/conftest.py),
and collects exactly the golden tests a full collection selects."""

from __future__ import annotations

import os
import subprocess
import sys

from suites.conftest import REPO_ROOT


def _collected(*, collect_all: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "GOLDEN_COLLECT_ALL"}
    if collect_all:
        env["GOLDEN_COLLECT_ALL"] = "1"
    out = subprocess.run([sys.executable, "-m", "pytest", "suites", "-m", "golden", "--collect-only", "-q",
                          "-p", "no:cacheprovider", "-p", "no:randomly"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return sorted(line for line in out.stdout.splitlines() if "::" in line)


def test_a_golden_session_collects_the_same_golden_tests_as_a_full_collection():
    shortcut, full = _collected(collect_all=False), _collected(collect_all=True)
    assert full, "a full collection found no golden test"
    assert shortcut == full
