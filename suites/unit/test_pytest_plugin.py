"""The ``golden`` pytest plugin as a user of ``pytest -m golden`` sees it (inner pytest runs).

Fast cases only: goldens that are missing or damaged are refused before any
workload starts, so no Ray is involved. The run-and-compare path is covered by
suites/golden and by ``test_failure_says_how_to_refresh`` (slow, one real run).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from suites.inner_golden import INNER_GOLDEN_TEST, REPO, SMOKE
from suites.stored_goldens import copy_stored, stored_dir

pytest_plugins = ["pytester"]

TEST_FILE = INNER_GOLDEN_TEST


@pytest.fixture(autouse=True)
def _no_prestart(monkeypatch):
    """Most inner sessions here refuse their goldens before any workload starts: none starts a
    warm runtime while it collects (harness.pytest_prestart), which it would shut down unused."""
    monkeypatch.setenv("GOLDEN_PRESTART", "0")


def _workload(root: Path, name: str, *, golden: bool, seed: int | None = None) -> None:
    """goldens/<name>/workload.yaml (the smoke spec renamed), with or without its cpu golden."""
    (root / name).mkdir(parents=True)
    text = (REPO / "goldens" / SMOKE / "workload.yaml").read_text().replace(f"name: {SMOKE}", f"name: {name}")
    if seed is not None:
        text = text.replace("seed: 1234", f"seed: {seed}")
    (root / name / "workload.yaml").write_text(text)
    if golden:
        copy_stored(SMOKE, root, as_workload=name)


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch):
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    monkeypatch.delenv("GOLDEN_ROOT", raising=False)
    root = pytester.path / "goldens"
    pytester.makepyfile(test_inner=TEST_FILE.format(root=str(root)))
    return pytester, root


def test_xdist_keeps_a_workload_on_one_worker_and_the_controller_writes_the_summary(inner):
    """-n 2 alone: each workload's surfaces carry its group (so it runs once), and
    the Markdown summary lists the workloads of every worker."""
    pytester, root = inner
    _workload(root, "wl_a", golden=False)
    _workload(root, "wl_b", golden=False)
    summary = pytester.path / "summary.md"
    result = pytester.runpytest_subprocess("-n", "2", "-m", "golden", "-p", "no:cacheprovider", "-p", "no:benchmark",
                                           "--goldens-root", str(root), f"--golden-summary={summary}", "-rf")
    result.assert_outcomes(failed=14)
    out = result.stdout.str()
    assert "test_golden_surface[wl_a-training]@wl_a" in out and "test_golden_surface[wl_b-topology]@wl_b" in out
    text = summary.read_text()
    assert "| wl_a | cpu | missing |" in text and "| wl_b | cpu | missing |" in text
    assert "golden capture wl_a --platform cpu" in out
    # the pytest hint repeats the goldens root this session was given (a rerun must act on these goldens)
    assert f"pytest -m golden -k wl_a --golden-capture-missing --golden-platform=cpu --goldens-root={root})" in out


def test_a_damaged_golden_fails_every_surface_without_running(inner):
    pytester, root = inner
    _workload(root, SMOKE, golden=True)
    (stored_dir(SMOKE, root=root) / "surfaces" / "rollouts.json").write_text("{}\n")
    result = pytester.runpytest_subprocess("-m", "golden", "-p", "no:cacheprovider", "-p", "no:benchmark",
                                           "--goldens-root", str(root))
    result.assert_outcomes(failed=7)
    out = result.stdout.str()
    # One failure body per surface. Lines of pytest's short summary start with
    # "FAILED" and repeat the message in full where pytest sees CI=1 (no truncation).
    label = stored_dir(SMOKE, root=root).name  # cpu, or this machine's CPU-numerics variant of it
    bodies = re.findall(rf"^golden {SMOKE}/{re.escape(label)} is unusable: .*rollouts\.json: sha256", out,
                        re.MULTILINE)
    assert len(bodies) == 7
    assert "golden-runs" not in out  # no run directory: the workload never started
    assert f"{SMOKE:<36} {label:<8} error" in out


@pytest.mark.slow
def test_failure_says_how_to_refresh(inner):
    """The workload's seed changed: the golden records its spec, so every selected surface fails
    before any run with the field named first (the spec-first finding), and the failure says
    how to refresh."""
    pytester, root = inner
    _workload(root, SMOKE, golden=True, seed=1235)
    result = pytester.runpytest_subprocess("-m", "golden", "-p", "no:cacheprovider", "-p", "no:benchmark",
                                           "--goldens-root", str(root), "-k", "training or topology")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert f"{SMOKE}/training: fail before any run" in out and "seed: 1234 -> 1235" in out
    assert f"golden refresh {SMOKE} --platform cpu --goldens-root {root} --reason TEXT" in out  # the root given
    assert f"--golden-refresh --golden-platform=cpu --goldens-root={root} --golden-reason=TEXT" in out
    assert out.count(f"{SMOKE:<36} {stored_dir(SMOKE, root=root).name:<8} fail") == 1


PLAIN_TEST_FILE = """
import pytest
from harness.pytest_plugin import golden_params

@pytest.mark.golden
@pytest.mark.parametrize("workload,surface", golden_params())
def test_golden_surface(golden, workload, surface):
    golden.check(workload, surface)
"""


def test_goldens_root_and_platform_options_select_the_parameters(pytester: pytest.Pytester, monkeypatch):
    """golden_params() with no arguments follows --goldens-root and --golden-platform
    (it used to list the repository's goldens for the host's platform whatever was asked)."""
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    monkeypatch.delenv("GOLDEN_ROOT", raising=False)
    root = pytester.path / "goldens"
    _workload(root, "cpu_only", golden=False)
    (root / "cpu_only" / "workload.yaml").write_text(
        (root / "cpu_only" / "workload.yaml").read_text().replace("platforms: [cpu, cuda]", "platforms: [cpu]"))
    _workload(root, "both", golden=False)
    pytester.makepyfile(test_inner=PLAIN_TEST_FILE)
    base = ["-m", "golden", "--co", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark", "--goldens-root", str(root)]
    cpu = pytester.runpytest_subprocess(*base).stdout.str()
    assert "cpu_only-topology" in cpu and "both-topology" in cpu and "qwen3_moe" not in cpu
    cuda = pytester.runpytest_subprocess(*base, "--golden-platform", "cuda").stdout.str()
    assert "both-topology" in cuda and "cpu_only" not in cuda


def test_a_broken_spec_fails_its_own_tests_not_the_collection(inner):
    pytester, root = inner
    _workload(root, "typo", golden=False)
    spec = root / "typo" / "workload.yaml"
    spec.write_text(spec.read_text().replace("policy: {tp: 1", "policy: {tpp: 1"))
    _workload(root, "fine", golden=False)
    result = pytester.runpytest_subprocess("-m", "golden", "-p", "no:cacheprovider", "-p", "no:benchmark",
                                           "--goldens-root", str(root))
    result.assert_outcomes(failed=14)
    out = result.stdout.str()
    # Failure bodies only (anchored): with CI=1 pytest's short summary repeats each message, so a
    # plain count could be met by the summary lines alone.
    assert len(re.findall(r"^workload typo: SpecError: .*policy\.tpp: unknown key", out, re.MULTILINE)) == 7
    assert len(re.findall(r"^no golden for workload 'fine' on platform 'cpu'", out, re.MULTILINE)) == 7


@pytest.mark.parametrize(("pytest_version", "xdist_version", "broken"), [
    ("9.0.3", "3.8.0", False), ("9.1.1", "3.8.0", False), ("9.2.0", "3.8.0", True), ("9.2.0.dev340", "3.5.0", True),
    ("9.2.0", "3.9.0", False), ("10.0.0", "unknown", False),
])
def test_loadgroup_breakage_is_recognised(monkeypatch, pytest_version, xdist_version, broken):
    """pytest 9.2 with pytest-xdist <= 3.8 does not group (pytest-dev/pytest-xdist#1386): the plugin warns."""
    import harness.pytest_plugin as plugin

    monkeypatch.setattr(plugin.pytest, "__version__", pytest_version)
    monkeypatch.setattr(plugin, "_xdist_version", lambda: xdist_version)
    assert plugin._loadgroup_broken() is broken


# -- fail closed (issue 17): every case below used to be an empty parameter set, a skip, or a
# collection error under --strict-markers, and is now a failing test (or a usage error) that names
# what is missing. Inner runs use --strict-markers and no ini file of this repository, so every
# marker they meet must be registered by the plugin itself.

STRICT = ["-m", "golden", "--strict-markers", "-p", "no:cacheprovider", "-p", "no:benchmark"]


def _plain(pytester: pytest.Pytester, monkeypatch) -> pytest.Pytester:
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    monkeypatch.delenv("GOLDEN_ROOT", raising=False)
    pytester.makepyfile(test_inner=PLAIN_TEST_FILE)
    return pytester


def test_no_goldens_root_is_one_failure_naming_it(pytester: pytest.Pytester, monkeypatch):
    pytester = _plain(pytester, monkeypatch)
    pytester.makefile(".toml", pyproject='[tool.golden]\ngoldens-root = "gate/goldens"\n')
    result = pytester.runpytest_subprocess(*STRICT, "-rf")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    missing = pytester.path / "gate" / "goldens"
    assert f"goldens root {missing} does not exist (from {pytester.path / 'pyproject.toml'} [tool.golden]" in out
    assert "--golden-capture-missing" in out and "skipped" not in out


def test_a_root_given_by_option_that_does_not_exist_fails(pytester: pytest.Pytester, monkeypatch):
    pytester = _plain(pytester, monkeypatch)
    result = pytester.runpytest_subprocess(*STRICT, "--goldens-root", "nowhere")
    result.assert_outcomes(failed=1)
    assert f"goldens root {pytester.path / 'nowhere'} does not exist (from --goldens-root)" in result.stdout.str()


def test_an_empty_root_is_no_workload_selected(pytester: pytest.Pytester, monkeypatch):
    pytester = _plain(pytester, monkeypatch)
    (pytester.path / "goldens").mkdir()
    result = pytester.runpytest_subprocess(*STRICT, "--goldens-root", "goldens")
    result.assert_outcomes(failed=1)
    assert "no workload selected: no " in result.stdout.str()


def test_the_old_option_spelling_is_refused_naming_the_new_one(pytester: pytest.Pytester, monkeypatch):
    pytester = _plain(pytester, monkeypatch)
    result = pytester.runpytest_subprocess(*STRICT, "--golden-root", "goldens")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--golden-root was renamed --goldens-root" in result.stderr.str()
    both = pytester.runpytest_subprocess(*STRICT, "--golden-capture-missing", "--golden-refresh",
                                         "--golden-reason", "x")
    assert both.ret == pytest.ExitCode.USAGE_ERROR and "give one of them" in both.stderr.str()


def test_backend_workloads_collect_under_strict_markers_and_a_missing_backend_fails(pytester, monkeypatch):
    """A megatron and a vllm workload: collected with --strict-markers (and without xdist, whose
    xdist_group mark the plugin registers too); megatron-core made unimportable (sys.modules entry
    None, Python's own "not importable" mark, as a stand-in for an install without it) fails its
    tests naming the package and the install command, before any worker starts; -m deselects."""
    pytester = _plain(pytester, monkeypatch)
    root = pytester.path / "goldens"
    name = "qwen3_moe_tiny_megatron_tp2pp2ep2"
    (root / name).mkdir(parents=True)
    (root / name / "workload.yaml").write_text((REPO / "goldens" / name / "workload.yaml").read_text())
    pytester.makeconftest("import sys\nsys.modules['megatron'] = None\n")
    collected = pytester.runpytest_subprocess(*STRICT, "-p", "no:xdist", "--co", "-q", "--goldens-root", str(root))
    assert collected.ret == 0, collected.stdout.str()
    result = pytester.runpytest_subprocess(*STRICT, "-p", "no:xdist", "--goldens-root", str(root))
    result.assert_outcomes(failed=7)
    out = result.stdout.str()
    assert len(re.findall(r"^workload .*: BackendMissing: .*policy\.backend: megatron needs the package "
                          r"megatron-core .*pip install 'grpo-golden-harness\[megatron\]'", out, re.MULTILINE)) == 7
    assert "golden-runs" not in out and "skipped" not in out
    deselected = pytester.runpytest_subprocess("-m", "golden and not megatron", "--strict-markers", "-p",
                                               "no:cacheprovider", "--goldens-root", str(root))
    assert deselected.ret == pytest.ExitCode.NO_TESTS_COLLECTED and "7 deselected" in deselected.stdout.str()


def test_unused_goldens_are_reported_and_fail_under_the_strict_flag(pytester: pytest.Pytester, monkeypatch):
    pytester = _plain(pytester, monkeypatch)
    pytester.makepyfile(test_other="def test_other():\n    pass\n")
    root = pytester.path / "goldens"
    _workload(root, "kept", golden=True)
    shutil.copytree(REPO / "goldens" / SMOKE / "cpu", root / "removed_workload" / "cpu")  # its spec is gone
    shutil.copytree(REPO / "goldens" / SMOKE / "cuda", root / "kept" / "cuda")  # another platform: not this session's
    base = ["-m", "not golden", "--strict-markers", "-p", "no:cacheprovider", "--goldens-root", str(root)]
    lenient = pytester.runpytest_subprocess(*base)
    assert lenient.ret == 0
    out = lenient.stdout.str()
    assert f"{root}/removed_workload/cpu: no test targets this golden" in out and "1 unused golden(s)" in out
    assert "kept/cpu: no test" not in out and "kept/cuda" not in out
    strict = pytester.runpytest_subprocess(*base, "--golden-strict-unused")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    assert "they fail the session (--golden-strict-unused)" in strict.stdout.str()
    # under xdist the workers collect, and the controller reports and decides
    spread = pytester.runpytest_subprocess(*base, "--golden-strict-unused", "-n", "2", "-p", "no:benchmark")
    assert spread.ret == pytest.ExitCode.TESTS_FAILED
    assert f"{root}/removed_workload/cpu: no test targets this golden" in spread.stdout.str()


def test_goldens_root_works_in_both_spellings_and_a_misread_space_form_is_refused(pytester: pytest.Pytester,
                                                                                  monkeypatch, tmp_path_factory):
    """``--goldens-root=DIR`` and ``--goldens-root DIR`` both select DIR; where pytest took the
    space form's DIR for a test path and so left the project's rootdir and configfile (DIR outside
    the project, pytest-dev/pytest#8846), the session is a usage error naming the ``=`` spelling
    (before: rootdir became DIR's folder, configfile none, and the session ran on)."""
    pytester = _plain(pytester, monkeypatch)
    pytester.makefile(".toml", pyproject='[tool.pytest.ini_options]\naddopts = "-p no:randomly"\n')
    outside = tmp_path_factory.mktemp("elsewhere") / "goldens"
    outside.mkdir()
    inside = pytester.path / "goldens"
    inside.mkdir()
    for args in ([f"--goldens-root={outside}"], ["--goldens-root", "goldens"], [f"--goldens-root={inside}"]):
        result = pytester.runpytest_subprocess(*STRICT, "-rf", *args)
        out = result.stdout.str()
        assert f"rootdir: {pytester.path}" in out and "configfile: pyproject.toml" in out, (args, out[:600])
        chosen = outside if str(outside) in args[0] else inside
        assert f"no workload selected: no {chosen}/<workload>/workload.yaml" in out, (args, out[-1500:])
    spaced = pytester.runpytest_subprocess(*STRICT, "--goldens-root", str(outside))
    assert spaced.ret == pytest.ExitCode.USAGE_ERROR, spaced.stdout.str()[-1500:]
    err = spaced.stderr.str()
    assert f"--goldens-root {outside}: pytest read the value as a test path" in err
    assert f"write it with '=': --goldens-root={outside}" in err
