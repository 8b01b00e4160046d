"""Process-wide torch settings a test may change, restored afterwards.

``torch.set_num_threads`` and ``torch.use_deterministic_algorithms`` are global
to the process: a test module that sets them and never restores them changes
every test that runs after it in the same (xdist) worker, so such a test's
outcome would depend on the order tests are scheduled in.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch


@contextmanager
def torch_settings(*, threads: int | None = 1, deterministic: bool | None = None) -> Iterator[None]:
    """Set the thread count and/or deterministic mode for the block, then restore both."""
    saved = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    if threads is not None:
        torch.set_num_threads(threads)
    if deterministic is not None:
        torch.use_deterministic_algorithms(deterministic)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1])


@pytest.fixture(scope="module", autouse=True)
def one_deterministic_thread() -> Iterator[None]:
    """A module-scoped autouse fixture: every test of a module that imports it runs on one
    torch thread with deterministic algorithms (``torch_settings``), restored after the module."""
    with torch_settings(threads=1, deterministic=True):
        yield
