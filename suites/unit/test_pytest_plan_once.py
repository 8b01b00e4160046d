"""The pytest session reads and plans a golden workload once (issue 42): the prestart's
pre-run verdicts (``harness.pytest_prestart.would_run`` -> ``pytest_before_run.before_run``)
build the plan, ``GoldenSession`` takes it and hands it to ``flows.execute(plan=...)``.

Test doubles, for what needs a whole run: the pytest ``Config`` (only ``getoption`` and the
results list are read) and ``flows.execute`` (it records the plan it was given and stops). The
spec, its file and the goldens root are the real ones. No Ray.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

import harness.spec.yaml_io as yaml_mod
from harness import flows, pytest_prestart
from harness.pytest_session import GoldenSession
from harness.spec.load import default_goldens_root

SMOKE = "qwen3_moe_tiny_smoke"


class Stop(Exception):
    """What the stand-in for ``flows.execute`` raises once it has seen its arguments."""


def _config(**options):
    values = {"--goldens-root": None, "--golden-platform": None, "--golden-ray-address": None,
              "--golden-refresh": False, "--golden-capture-missing": False, "--golden-reason": None,
              "--golden-allow-dirty": False, "--golden-option": [], **options}
    return SimpleNamespace(getoption=lambda name, default=None: values.get(name, default), _golden_results=[])


@pytest.fixture
def reads(monkeypatch):
    counted: Counter = Counter()
    real = yaml_mod.load_yaml_file

    def load_yaml_file(path, *args, **kwargs):
        counted[str(path)] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(yaml_mod, "load_yaml_file", load_yaml_file)  # runplan imports it per call
    return counted


@pytest.fixture
def executed(monkeypatch):
    seen = []

    def execute(workload, **kwargs):
        seen.append(kwargs)
        raise Stop

    monkeypatch.setattr(flows, "execute", execute)
    return seen


def test_the_prestarts_plan_is_the_runs_and_the_file_is_read_once(tmp_path, reads, executed, monkeypatch):
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    config = _config(**{"--golden-option": ["collective_timeout_s=900"]})
    root = default_goldens_root().resolve()
    assert pytest_prestart.would_run(config, SMOKE, root) is True
    session = GoldenSession(config, tmp_path, session_root=lambda: root)
    monkeypatch.setattr(session, "warm_runtime", lambda: None)
    monkeypatch.setenv("GOLDEN_PROGRESS", "off")
    _platform, entry = session._outcome(SMOKE, root)
    assert entry[0] == "error" and "Stop" in entry[1]  # the stand-in stopped the run
    (kwargs,) = executed
    run_plan = kwargs["plan"]
    assert run_plan is not None and run_plan.workload.name == SMOKE
    assert run_plan.options.collective_timeout_s == 900.0  # --golden-option reaches the plan
    smoke = [path for path in reads if path.endswith(f"{SMOKE}/workload.yaml")]
    assert [reads[p] for p in smoke] == [1], reads  # would_run's read; the session read nothing again
    assert pytest_prestart.taken_before_run(config, SMOKE, root) is None  # handed over once


def test_a_refreshing_session_plans_again(tmp_path, reads, executed, monkeypatch):
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    config = _config(**{"--golden-refresh": True, "--golden-allow-dirty": True})
    root = default_goldens_root().resolve()
    pytest_prestart.would_run(config, SMOKE, root)
    session = GoldenSession(config, tmp_path, session_root=lambda: root)
    monkeypatch.setattr(session, "warm_runtime", lambda: None)
    monkeypatch.setenv("GOLDEN_PROGRESS", "off")
    session._outcome(SMOKE, root)
    assert executed and executed[0]["plan"] is not None
    smoke = [path for path in reads if path.endswith(f"{SMOKE}/workload.yaml")]
    assert [reads[p] for p in smoke] == [2]  # a refresh decides from the files as they are when it runs
