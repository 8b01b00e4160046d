"""``GoldenSession.adopt_run`` answers a golden's checks from a test's run only when that run is
exactly the one the ``golden`` fixture would make (with a real warm run: ``suites/golden/
test_cold_warm_isolation.py``, whose runs then answer ``test_goldens.py``).

Test doubles, for what needs a whole run: the pytest ``Config`` (only ``getoption`` and the
results list the session writes to are read), the run's postflight (its status) and the
comparison with the golden (``flows.compare_with_golden``, which reads a run directory). The
spec, its loading and the goldens root are the real ones. No Ray.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness import flows
from harness.pytest_session import GoldenSession
from harness.spec.load import default_goldens_root
from suites.stored_goldens import stored_dir

SMOKE = "qwen3_moe_tiny_smoke"


def _session(tmp_path, **options) -> GoldenSession:
    values = {"--goldens-root": None, "--golden-platform": None, "--golden-ray-address": None,
              "--golden-refresh": False, "--golden-capture-missing": False, "--golden-reason": None, **options}
    config = SimpleNamespace(getoption=lambda name, default=None: values.get(name, default), _golden_results=[])
    return GoldenSession(config, tmp_path, session_root=lambda: default_goldens_root().resolve())


def _execution(overrides=(), ok=True) -> flows.Execution:
    spec = flows.spec_for_platform(SMOKE, tuple(overrides), None, None)
    postflight = SimpleNamespace(status="complete" if ok else "incomplete")
    return flows.Execution(spec, default_goldens_root(), postflight, 1.0)


@pytest.fixture(autouse=True)
def compared(monkeypatch):
    calls = []

    def compare_with_golden(execution, platform, root):
        calls.append((execution, platform))
        return SimpleNamespace(ok=True, status="parity", surfaces={})

    monkeypatch.setattr(flows, "compare_with_golden", compare_with_golden)
    return calls


def test_the_fixtures_own_run_is_adopted_and_answers_the_checks(tmp_path, compared):
    session = _session(tmp_path)
    execution = _execution()
    assert session.adopt_run(SMOKE, execution) is True
    assert compared == [(execution, stored_dir(SMOKE).name)]  # cpu or this machine's variant of it
    outcome, _, adopted, verdict = session._evaluate(SMOKE)  # no run: the adopted one answers
    assert (outcome, adopted) == ("compared", execution) and verdict.ok
    assert [r["workload"] for r in session.config._golden_results] == [SMOKE]
    assert session.adopt_run(SMOKE, _execution()) is False  # evaluated once, never replaced


@pytest.mark.parametrize("case", ["override", "incomplete", "hook", "refresh", "cluster", "evaluated", "run option"])
def test_a_run_other_than_the_fixtures_own_is_not_adopted(tmp_path, monkeypatch, compared, case):
    options = {"refresh": {"--golden-refresh": True}, "cluster": {"--golden-ray-address": "10.0.0.1:6379"},
               "run option": {"--golden-option": ["collective_timeout_s=60"]}}  # the session's runs use it
    session = _session(tmp_path, **options.get(case, {}))
    execution = _execution(("grpo.iterations=2",) if case == "override" else (), ok=case != "incomplete")
    if case == "hook":
        monkeypatch.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.extra_operator")
    if case == "evaluated":
        session._cache[(str(default_goldens_root().resolve()), SMOKE)] = ("compared", "", None, None)
    assert session.adopt_run(SMOKE, execution) is False
    assert session.config._golden_results == [] and compared == []
    if case != "evaluated":
        assert session._cache == {}
