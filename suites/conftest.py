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
