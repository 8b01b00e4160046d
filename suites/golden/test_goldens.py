"""One test per scheduled workload x gated surface (``pytest -m golden``).

Each workload runs once (cached by the ``golden`` fixture of the harness's
pytest plugin) and every surface is compared with ``goldens/<w>/<platform>``.
"""

import pytest

from harness.pytest_plugin import golden_params


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("workload,surface", golden_params())
def test_golden_surface(golden, workload, surface):
    golden.check(workload, surface)
