"""What the tests of the pytest plugin run inside ``pytester``: the
repository's built-in smoke workload and a test file that checks every golden
under a given root, as another repository's gate job would."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOKE = "qwen3_moe_tiny_smoke"

# ``.format(root=...)``: one golden test per (workload, surface) under ``root``.
INNER_GOLDEN_TEST = """
import pytest
from harness.pytest_plugin import golden_params

@pytest.mark.golden
@pytest.mark.parametrize("workload,surface", golden_params({root!r}))
def test_golden_surface(golden, workload, surface):
    golden.check(workload, surface)
"""
