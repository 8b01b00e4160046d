"""A golden-only pytest session starts its warm runtime while it collects (harness.pytest_prestart).

Inner pytest sessions (pytester, in a subprocess) report what the ``golden`` fixture's runtime
held when their first test asked for it: prestarted, Ray is up with one policy, one rollout and
one data-plane process idle before any workload ran; with ``GOLDEN_PRESTART=0`` nothing is up
yet. A golden-marked test that does not use the fixture runs with no Ray instance of ours.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow

INNER = '''
import pytest


@pytest.mark.golden
def test_plain_first():
    import ray
    print("PLAIN ray_up=%s" % ray.is_initialized())


@pytest.mark.golden
def test_runtime_at_first_use(golden):
    runtime = golden.warm_runtime()
    up = runtime.ray_up()
    print("FIRST ray_up=%s idle=%s dataplanes=%s" % (up, runtime.idle(), len(runtime._idle_dataplanes)))
'''


def _session(pytester: pytest.Pytester, *args: str, passed: int = 1) -> str:
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "-p", "no:benchmark", *args)
    result.assert_outcomes(passed=passed)
    return result.stdout.str()


def test_a_golden_session_finds_its_runtime_started(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.delenv("GOLDEN_PRESTART", raising=False)
    monkeypatch.delenv("GOLDEN_WARM", raising=False)
    out = _session(pytester, "-m", "golden", "-k", "first_use")
    assert "FIRST ray_up=True idle={'policy': 1, 'rollout': 1} dataplanes=1" in out


def test_without_prestart_the_first_workload_starts_it(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("GOLDEN_PRESTART", "0")
    out = _session(pytester, "-m", "golden", "-k", "first_use")
    assert "FIRST ray_up=False idle={'policy': 0, 'rollout': 0} dataplanes=0" in out


def test_a_test_without_the_fixture_meets_no_prestarted_ray(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.delenv("GOLDEN_PRESTART", raising=False)
    monkeypatch.delenv("GOLDEN_WARM", raising=False)
    out = _session(pytester, "-m", "golden", passed=2)
    assert "PLAIN ray_up=False" in out
    # the runtime closed before the plain test starts again on first use, unprestarted
    assert "FIRST ray_up=False" in out
