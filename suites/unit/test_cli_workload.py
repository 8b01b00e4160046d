"""`golden run | check | capture | refresh`: what they refuse, refused before a workload starts.

The workload commands start Ray and run for tens of seconds, so every usage
error must be reported first. ``no_run`` replaces ``flows.execute`` with a
sentinel that fails the test if a run is attempted: it stands in for the
real run only to prove that none starts (the real runs are exercised by
suites/faults/test_cli_exit_codes.py and the golden suite).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness import flows
from harness.cli import EXIT_INTERRUPTED, EXIT_NO_VERDICT, EXIT_USAGE, build_parser, main
from suites.stored_goldens import copy_stored, stored_dir

REPO = Path(__file__).resolve().parents[2]
SMOKE = "qwen3_moe_tiny_smoke"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A goldens root with the smoke workload and its stored cpu golden."""
    r = tmp_path / "goldens"
    (r / SMOKE).mkdir(parents=True)
    shutil.copy(REPO / "goldens" / SMOKE / "workload.yaml", r / SMOKE / "workload.yaml")
    copy_stored(SMOKE, r)
    return r


@pytest.fixture
def no_run(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the workload must not start for a usage error")

    monkeypatch.setattr(flows, "execute", refuse)
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)


def test_check_without_golden_is_refused_before_running(root, tmp_path, no_run, capsys):
    shutil.rmtree(stored_dir(SMOKE, root=root))
    code = main(["check", SMOKE, "--goldens-root", str(root), "--run-dir", str(tmp_path / "run")])
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "no golden for workload" in err and f"golden capture {SMOKE} --platform cpu" in err


def test_check_with_a_hand_edited_golden_is_refused_and_names_the_file(root, tmp_path, no_run, capsys):
    training = stored_dir(SMOKE, root=root) / "surfaces" / "training.json"
    training.write_bytes(training.read_bytes().replace(b'"step":1', b'"step":7'))
    code = main(["check", SMOKE, "--goldens-root", str(root), "--run-dir", str(tmp_path / "run")])
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert str(training) in err and "sha256" in err


def test_check_with_a_golden_of_another_schema_version_is_refused(root, tmp_path, no_run, capsys):
    manifest = stored_dir(SMOKE, root=root) / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"schema_version":2', b'"schema_version":1'))
    assert main(["check", SMOKE, "--goldens-root", str(root), "--run-dir", str(tmp_path / "run")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "schema_version 1" in err and "reads 2" in err and "golden refresh" in err


@pytest.mark.parametrize("make_output", ["dir", "under_a_file"])
def test_check_unusable_output_is_refused_before_running(root, tmp_path, no_run, capsys, make_output):
    if make_output == "dir":
        out = tmp_path / "reports"
        out.mkdir()
    else:
        (tmp_path / "afile").write_text("x")
        out = tmp_path / "afile" / "report.md"
    code = main(["check", SMOKE, "--goldens-root", str(root), "--output", str(out), "--run-dir", str(tmp_path / "r")])
    assert code == EXIT_USAGE
    assert "--output" in capsys.readouterr().err


def test_capture_over_an_existing_golden_is_refused_before_running(root, tmp_path, no_run, capsys):
    assert main(["capture", SMOKE, "--goldens-root", str(root), "--run-dir", str(tmp_path / "r")]) == EXIT_USAGE
    assert f"golden refresh {SMOKE} --platform cpu" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["capture"], ["refresh", "--reason", "r"]])
def test_unscheduled_platform_is_refused_before_running(root, tmp_path, no_run, capsys, command):
    code = main([*command, SMOKE, "--goldens-root", str(root), "--platform", "tpu", "--run-dir", str(tmp_path / "r")])
    assert code == EXIT_USAGE
    assert "'tpu' is not scheduled" in capsys.readouterr().err


def test_capture_with_an_empty_reason_is_refused(root, no_run, capsys):
    assert main(["capture", SMOKE, "--goldens-root", str(root), "--platform", "cuda", "--reason", " "]) == EXIT_USAGE
    assert "--reason TEXT must not be empty" in capsys.readouterr().err  # refused for the reason, nothing else


def test_run_dir_that_is_not_empty_or_not_a_directory_is_refused(root, tmp_path, no_run, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "run.json").write_text("{}")
    assert main(["run", SMOKE, "--goldens-root", str(root), "--run-dir", str(full)]) == EXIT_USAGE
    assert "not empty" in capsys.readouterr().err
    assert main(["run", SMOKE, "--goldens-root", str(root), "--run-dir", str(full / "run.json")]) == EXIT_USAGE
    assert "not a directory" in capsys.readouterr().err
    assert main(["run", SMOKE, "--goldens-root", str(root), "--run-dir", str(full / "run.json" / "x")]) == EXIT_USAGE
    assert "cannot create" in capsys.readouterr().err


def test_typo_in_a_spec_is_refused_naming_file_and_field(root, tmp_path, no_run, capsys):
    spec = root / SMOKE / "workload.yaml"
    spec.write_text(spec.read_text().replace("policy: {tp: 1", "policy: {tpp: 1"))
    for command in (["run"], ["check"], ["capture"], ["refresh", "--reason", "r"], ["plan"], ["doctor"]):
        assert main([*command, SMOKE, "--goldens-root", str(root)]) == EXIT_USAGE, command
        err = capsys.readouterr().err
        assert f"{spec}: policy.tpp: unknown key" in err, (command, err)


def test_every_workload_command_takes_goldens_root_and_its_old_spelling():
    parser = build_parser()
    for command in ("run", "check", "capture", "refresh", "doctor"):
        for flag in ("--goldens-root", "--goldens"):
            args = parser.parse_args([command, SMOKE, flag, "/x"])
            assert args.goldens == "/x", (command, flag)


def test_an_internal_error_exits_3_not_1(monkeypatch, capsys):
    from harness.cli import list_cmd

    def broken(root):  # a bug anywhere below a command
        raise OSError("disk went away")

    monkeypatch.setattr(list_cmd, "collect", broken)
    assert main(["list"]) == EXIT_NO_VERDICT
    err = capsys.readouterr().err
    assert "internal error" in err and "disk went away" in err


def test_ctrl_c_exits_130(monkeypatch, capsys):
    from harness.cli import list_cmd

    def interrupted(root):
        raise KeyboardInterrupt

    monkeypatch.setattr(list_cmd, "collect", interrupted)
    assert main(["list"]) == EXIT_INTERRUPTED
    assert "interrupted" in capsys.readouterr().err


def test_check_on_an_unscheduled_platform_says_so_instead_of_suggesting_capture(root, no_run, capsys):
    assert main(["check", SMOKE, "--goldens-root", str(root), "--platform", "tpu"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "'tpu' is not scheduled" in err and "golden capture" not in err


def test_overrides_may_follow_options(root, monkeypatch):
    """`golden run W --platform cpu a.b=1` used to fail with 'unrecognized arguments: a.b=1'."""
    seen = {}

    def record(workload, *, overrides, **kwargs):
        seen["overrides"] = overrides
        raise KeyboardInterrupt  # stop right there; main reports it as interrupted

    monkeypatch.setattr(flows, "execute", record)
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    code = main(["run", SMOKE, "grpo.iterations=1", "--goldens-root", str(root), "--platform", "cpu",
                 "rollout.max_new_tokens=8"])
    assert code == EXIT_INTERRUPTED
    assert seen["overrides"] == ("grpo.iterations=1", "rollout.max_new_tokens=8")


def test_unknown_option_is_still_a_usage_error(root, capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", SMOKE, "--goldens-root", str(root), "--no-such-flag"])
    assert info.value.code == EXIT_USAGE
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_refresh_with_an_invalid_tolerances_file_is_refused_before_running(root, no_run, capsys):
    """refresh carries tolerances.yaml into the new golden verbatim: a broken one must be fixed first."""
    tolerances = stored_dir(SMOKE, root=root) / "tolerances.yaml"
    tolerances.write_text("version: 1\nlanes: [unclosed\n")
    assert main(["refresh", SMOKE, "--goldens-root", str(root), "--platform", "cpu", "--reason", "r"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert str(tolerances) in err and "fix" in err
