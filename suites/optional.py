"""Skip marks for optional packages that do not import the package at collection.

``pytest.importorskip`` at module level imports the package while pytest collects, in
every run that collects the module, also one that then deselects every test of it
(``pytest -m golden``): megatron-core's import alone took about 3 s there (it compiles
functions with ``torch.compile`` at import, which loads all of torch's inductor).
:func:`needs` decides from the installed files (``harness.spec.backends.module_available``,
no import), so the tests that run import the package themselves, and a package that is
installed but broken fails them instead of skipping them.
"""

from __future__ import annotations

import pytest

from harness.spec.backends import module_available


def needs(module: str, reason: str | None = None) -> pytest.MarkDecorator:
    """A ``skipif`` mark: skip unless ``module`` (dotted) is installed."""
    return pytest.mark.skipif(not module_available(module), reason=reason or f"{module} is not installed")


MEGATRON = needs("megatron.core", "megatron-core not installed (pip install megatron-core==0.16.1)")
"""The megatron-core modules' mark (``policy.backend: megatron``)."""
