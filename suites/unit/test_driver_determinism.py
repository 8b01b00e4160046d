"""The driver turns deterministic algorithms on without importing torch._inductor (Session._start)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys, torch
{before}
from harness.runner.session import deterministic_driver
deterministic_driver()
import torch
print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
      "torch._inductor.config" in sys.modules)
{after}
"""


def _probe(before: str = "", after: str = "") -> str:
    out = subprocess.run([sys.executable, "-c", PROBE.format(before=before, after=after)], capture_output=True,
                         text=True, timeout=120, check=True)
    return out.stdout.split()


def test_the_kernels_flag_is_on_and_inductor_is_not_imported():
    assert _probe() == ["True", "False", "False"]


def test_with_inductor_imported_the_public_call_sets_its_option_too():
    words = _probe(before="import torch._inductor.config", after="print(torch._inductor.config.deterministic)")
    assert words == ["True", "False", "True", "True"]
