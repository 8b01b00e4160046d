"""Shared test configuration: deterministic hypothesis profiles, repo paths."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

try:
    from hypothesis import HealthCheck, settings

    # `ci` (default): derandomized and bounded, so CI is deterministic and fast.
    # `nightly`: many more examples. Choose with HYPOTHESIS_PROFILE.
    settings.register_profile(
        "ci",
        derandomize=True,
        max_examples=60,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile(
        "nightly",
        max_examples=2000,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # the light install has no hypothesis
    pass


# -- a golden-only session imports only the modules that can hold golden tests ---------------------
# `pytest suites -m golden` would import all ~150 test modules (about 5 s of the session's
# collection, on its critical path) to keep the few dozen golden tests of a handful of them.
# A test module of this repository marks its golden tests itself: its text then says
# `mark.golden` or `golden_params` (the plugin's parametrization). Modules that say neither are
# not imported in such a session. suites/unit/test_golden_collection.py checks that the golden
# tests collected this way are exactly those a full collection selects;
# GOLDEN_COLLECT_ALL=1 turns the shortcut off.
GOLDEN_MODULE_SIGNS = ("mark.golden", "golden_params")
COLLECT_ALL_ENV = "GOLDEN_COLLECT_ALL"


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if os.environ.get(COLLECT_ALL_ENV, "").strip() == "1" or not _golden_only(config):
        return None
    try:
        text = collection_path.read_text(encoding="utf-8")
    except OSError:
        return None  # pytest reports the unreadable module itself
    return True if not any(sign in text for sign in GOLDEN_MODULE_SIGNS) else None


def _golden_only(config) -> bool:
    cached = getattr(config, "_golden_only_session", None)
    if cached is None:
        from harness.pytest_prestart import golden_only

        cached = config._golden_only_session = golden_only(config.getoption("markexpr", "") or "")
    return cached
