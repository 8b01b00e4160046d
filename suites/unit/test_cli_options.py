"""The `golden` command line: one spelling per option, usage errors per subcommand, --version,
--output format from the suffix, hints that repeat the user's options, no run dir when refused.

``no_run`` replaces ``flows.execute`` with a sentinel that fails the test if a run is
attempted (a refused command must not start one); nothing here runs a workload.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import __version__, flows
from harness.cli import EXIT_USAGE, build_parser, main
from harness.cli._options import report_format
from harness.cli.hints import golden_command, pytest_refresh_hint, root_if_chosen
from suites.stored_goldens import copy_stored, stored_dir

REPO = Path(__file__).resolve().parents[2]
SMOKE = "qwen3_moe_tiny_smoke"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "my goldens"            # a space: hints must quote it
    (r / SMOKE).mkdir(parents=True)
    shutil.copy(REPO / "goldens" / SMOKE / "workload.yaml", r / SMOKE / "workload.yaml")
    copy_stored(SMOKE, r)
    return r


@pytest.fixture
def no_run(monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError("the workload must not start for a usage error")

    monkeypatch.setattr(flows, "execute", refuse)
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    monkeypatch.delenv("GOLDEN_RUNS", raising=False)
    monkeypatch.chdir(tmp_path)


def make_run(run: Path, docs: dict) -> Path:
    """A run directory as postflight leaves it (surfaces/*.json, manifest.json), no artifacts."""
    from harness.manifest import surface_entry
    from harness.parity.synthetic import synthetic_manifest
    from harness.surfaces import surface_file_bytes

    (run / "surfaces").mkdir(parents=True)
    for name, doc in docs.items():
        (run / "surfaces" / f"{name}.json").write_bytes(surface_file_bytes(doc))
    manifest = synthetic_manifest("w")
    manifest["surfaces"] = [surface_entry(run, name) for name in sorted(docs)]
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return run


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == EXIT_USAGE
    return capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"golden {__version__}"


def test_misspelled_option_prints_the_subcommands_usage_and_a_suggestion(capsys):
    err = _usage_error(["check", SMOKE, "--goldens-rot", "x"], capsys)
    assert err.startswith("usage: golden check ")
    assert "unrecognized arguments: --goldens-rot" in err and "(did you mean --goldens-root?)" in err
    err = _usage_error(["list", "--jsn"], capsys)
    assert err.startswith("usage: golden list ") and "(did you mean --json?)" in err


def test_misspelled_command_and_top_level_option_get_a_suggestion(capsys):
    assert "(did you mean check?)" in _usage_error(["chek", SMOKE], capsys)
    assert "(did you mean --version?)" in _usage_error(["--verison"], capsys)


def test_abbreviations_are_not_a_second_spelling(capsys):
    err = _usage_error(["check", SMOKE, "--plat", "cpu"], capsys)
    assert "(did you mean --platform?)" in err


def test_an_option_far_from_any_gets_no_suggestion(capsys):
    err = _usage_error(["check", SMOKE, "--zzzzzzzz"], capsys)
    assert "unrecognized arguments: --zzzzzzzz" in err and "did you mean" not in err


def test_every_subcommand_spells_the_goldens_root_the_same():
    parser = build_parser()
    subparsers = parser.get_default("_subparsers")
    spelled = {}
    for name, sub in subparsers.items():
        shown = [(s, a.help, a.metavar) for a in sub._actions if a.help != argparse.SUPPRESS
                 for s in a.option_strings if "golden" in s]
        if shown:
            spelled[name] = shown
    assert set(spelled) == {"list", "plan", "run", "check", "capture", "refresh", "diff", "lint", "lock", "doctor",
                            "affected", "locate"}
    assert len({tuple(v) for v in spelled.values()}) == 1, spelled
    assert next(iter(spelled.values()))[0][0] == "--goldens-root"


def test_goldens_root_env_is_the_default_everywhere(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    monkeypatch.setenv("GOLDEN_ROOT", str(empty))
    assert main(["list"]) == 0
    assert f"0 workloads in {empty}" in capsys.readouterr().out
    assert main(["lint"]) == 0
    assert main(["plan", "mine"]) == EXIT_USAGE          # not in $GOLDEN_ROOT (nor a built-in workload)
    (empty / "mine").mkdir()
    (empty / "mine" / "workload.yaml").write_text(
        (REPO / "goldens" / SMOKE / "workload.yaml").read_text().replace(f"name: {SMOKE}", "name: mine"))
    assert main(["plan", "mine"]) == 0                  # found in $GOLDEN_ROOT


@pytest.mark.parametrize("fmt,output,expected", [
    (None, "r.html", "html"), (None, "r.md", "markdown"), (None, "r.xml", "junit"), (None, "r.json", "json"),
    (None, "r.txt", "terminal"), (None, None, "terminal"), ("markdown", "r.txt", "markdown"),
    ("json", "R.JSON", "json"), ("html", None, "html"),
])
def test_report_format_follows_the_output_suffix(fmt, output, expected):
    assert report_format(fmt, output) == expected


def test_report_format_refuses_a_contradiction():
    with pytest.raises(ValueError, match=r"--output r\.html: the suffix \.html means --format html"):
        report_format("markdown", "r.html")


def test_check_refuses_a_format_the_output_suffix_contradicts(root, no_run, capsys, tmp_path):
    code = main(["check", SMOKE, "--goldens-root", str(root), "--output", str(tmp_path / "r.xml"),
                 "--format", "html"])
    assert code == EXIT_USAGE
    assert "means --format junit" in capsys.readouterr().err


def test_diff_writes_html_for_an_html_output_without_format(tmp_path, capsys):
    from harness.parity.synthetic import synthetic_surfaces
    from harness.store import new_provenance, write_golden

    docs = synthetic_surfaces("w", seed=5)
    run = make_run(tmp_path / "run", docs)
    golden = write_golden(tmp_path / "goldens", "w", "cpu", json.loads((run / "manifest.json").read_text()), docs,
                          new_provenance(commit=None, reason="test", command="pytest", environment={}))
    out = tmp_path / "report.html"
    assert main(["diff", str(run), str(golden), "--output", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["diff", str(run), str(golden), "--output", str(tmp_path / "x.md"), "--format", "json"]) == 2
    assert not (tmp_path / "x.md").exists()


def test_refused_check_and_capture_leave_no_run_directory(root, no_run, tmp_path, capsys):
    shutil.rmtree(stored_dir(SMOKE, root=root))
    assert main(["check", SMOKE, "--goldens-root", str(root)]) == EXIT_USAGE          # no golden
    assert main(["capture", SMOKE, "--goldens-root", str(root), "--platform", "tpu"]) == EXIT_USAGE
    deep = tmp_path / "a" / "b" / "run"
    assert main(["check", SMOKE, "--goldens-root", str(root), "--run-dir", str(deep)]) == EXIT_USAGE
    out = tmp_path / "reports" / "r.md"
    assert main(["check", SMOKE, "--goldens-root", str(root), "--output", str(out)]) == EXIT_USAGE
    assert not (tmp_path / "runs").exists() and not (tmp_path / "a").exists()
    assert not (tmp_path / "reports").exists()


def test_refused_capture_over_an_existing_golden_leaves_no_run_dir_and_hints_with_the_users_options(
        root, no_run, tmp_path, capsys):
    code = main(["capture", SMOKE, "grpo.iterations=2", "--goldens-root", str(root)])
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"golden refresh {SMOKE} grpo.iterations=2 --platform cpu --goldens-root '{root}' --reason TEXT" in err
    assert not (tmp_path / "runs").exists()


def test_missing_golden_hint_repeats_root_overrides_and_platform(root, no_run, capsys):
    shutil.rmtree(stored_dir(SMOKE, root=root))
    assert main(["check", SMOKE, "rollout.max_new_tokens=8", "--goldens-root", str(root)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"golden capture {SMOKE} rollout.max_new_tokens=8 --platform cpu --goldens-root '{root}'" in err


def test_hint_builders_quote_and_omit_what_was_not_chosen(monkeypatch):
    assert golden_command("refresh", "w", platform="cpu", reason=True) == (
        "golden refresh w --platform cpu --reason TEXT")
    assert golden_command("capture", "a b.yaml", overrides=["x.y=1 2"], goldens_root="/g r") == (
        "golden capture 'a b.yaml' 'x.y=1 2' --goldens-root '/g r'")
    assert pytest_refresh_hint("w", platform="cpu", goldens_root="g") == (
        "pytest -m golden -k w --golden-refresh --golden-platform=cpu --goldens-root=g --golden-reason=TEXT")
    monkeypatch.delenv("GOLDEN_ROOT", raising=False)
    from harness.spec.load import default_goldens_root

    assert root_if_chosen(default_goldens_root()) is None
    assert root_if_chosen("/consumer/goldens") == Path("/consumer/goldens")
    monkeypatch.setenv("GOLDEN_ROOT", "/consumer/goldens")     # the environment picks it again
    assert root_if_chosen("/consumer/goldens") is None


def test_pytest_hint_text_keeps_a_consumer_root(monkeypatch):
    from harness.pytest_session import refresh_hint_text
    from harness.spec.load import default_goldens_root

    monkeypatch.delenv("GOLDEN_ROOT", raising=False)
    text = refresh_hint_text("w", "cpu", Path("/consumer/goldens"))
    assert "golden refresh w --platform cpu --goldens-root /consumer/goldens --reason TEXT" in text
    assert "pytest -m golden -k w --golden-refresh --golden-platform=cpu --goldens-root=/consumer/goldens" in text
    assert "--goldens-root" not in refresh_hint_text("w", "cpu", default_goldens_root())


def test_help_and_version_import_neither_torch_nor_ray_nor_rich():
    code = ("import sys; from harness.cli import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'ray', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip().splitlines()[-1] == "[]"
