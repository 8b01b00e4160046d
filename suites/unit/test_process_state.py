"""``harness.runner.process_state.freeze_heap``: what is alive goes to the permanent generation, once asked."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """import gc, sys, torch
from harness.runner.process_state import freeze_heap
garbage = [[] for _ in range(3)]
for g in garbage:
    g.append(g)  # cycles: garbage once the list is dropped
del garbage
freeze_heap(collect={collect})
print(gc.get_freeze_count(), gc.get_count()[0])
"""


@pytest.mark.parametrize("collect", [True, False])
def test_freeze_heap_freezes_what_is_alive(collect):
    out = subprocess.run([sys.executable, "-c", CODE.format(collect=collect)], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    frozen, young = int(out[0]), int(out[1])
    assert frozen > 100_000  # torch's modules, classes and functions
    assert young == 0


def test_golden_gc_freeze_0_turns_it_off():
    env_code = "import os; os.environ['GOLDEN_GC_FREEZE'] = '0'\n" + CODE.format(collect=True)
    out = subprocess.run([sys.executable, "-c", env_code], capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    assert int(out[0]) == 0
