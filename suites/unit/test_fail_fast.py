"""Verdicts decided from files come at once: the pytest plugin starts no Ray for them.

Inner pytest sessions (subprocesses) with the warm-runtime prestart left on (its default),
in a consumer-like directory (``[tool.golden]`` in pyproject.toml). Each verdict is known
without running a workload, so the session must end before Ray could start: no "Started a
local Ray instance" in its output, and well under the 11-22 s a session that starts and
stops Ray takes on the 2-core box (measured before: missing golden 11.8 s, ``-k`` selecting
nothing 11.7 s, unknown workload 22.7 s; after: 1.1-1.6 s).
"""

from __future__ import annotations

import time

import pytest

from suites.inner_golden import REPO, SMOKE

pytest_plugins = ["pytester"]

TEST_FILE = """
import pytest
from harness.pytest_plugin import golden_params


@pytest.mark.golden
@pytest.mark.parametrize("workload,surface", golden_params())
def test_golden(golden, workload, surface):
    golden.check(workload, surface)
"""
BOUND_S = 8.0  # about 1-2 s measured; the bound is below a Ray start and stop, with room for a loaded box


@pytest.fixture
def consumer(pytester: pytest.Pytester, monkeypatch) -> pytest.Pytester:
    for name in ("GOLDEN_PRESTART", "GOLDEN_WARM", "GOLDEN_PLATFORM", "GOLDEN_ROOT"):
        monkeypatch.delenv(name, raising=False)
    (pytester.path / "goldens" / "my_smoke").mkdir(parents=True)
    spec = (REPO / "goldens" / SMOKE / "workload.yaml").read_text().replace(f"name: {SMOKE}", "name: my_smoke")
    (pytester.path / "goldens" / "my_smoke" / "workload.yaml").write_text(spec)
    pytester.makepyfile(test_golden=TEST_FILE)
    return pytester


def _session(pytester: pytest.Pytester, *args: str):
    t = time.perf_counter()
    result = pytester.runpytest_subprocess("-m", "golden", "-p", "no:cacheprovider", "-p", "no:randomly", *args)
    wall = time.perf_counter() - t
    out = result.stdout.str() + result.stderr.str()
    assert "Started a local Ray instance" not in out, out[-3000:]
    assert wall < BOUND_S, (wall, out[-2000:])
    return result


def _pyproject(pytester: pytest.Pytester, workloads: str = "") -> None:
    pytester.makefile(".toml", pyproject=f'[tool.golden]\ngoldens-root = "goldens"\n{workloads}')


def test_a_missing_golden_fails_without_starting_ray(consumer: pytest.Pytester):
    _pyproject(consumer)
    result = _session(consumer)
    result.assert_outcomes(failed=7)  # one test per gated surface, numerics included
    assert "no golden for workload 'my_smoke'" in result.stdout.str()


def test_k_selecting_no_golden_ends_without_starting_ray(consumer: pytest.Pytester):
    _pyproject(consumer)
    result = _session(consumer, "-k", "no_such_test")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_an_unknown_workload_fails_without_starting_ray(consumer: pytest.Pytester):
    _pyproject(consumer, 'workloads = ["no_such_workload"]\n')
    result = _session(consumer)
    result.assert_outcomes(failed=7)  # one test per gated surface, numerics included
    assert "no workload named 'no_such_workload'" in result.stdout.str()
