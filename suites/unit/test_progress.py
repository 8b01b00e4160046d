"""Progress on stderr (harness.progress): plain lines with a heartbeat, a live display in a terminal.

No timing decides a verdict here: the heartbeat is driven by a fake clock
(``tick()`` called by the test), and the pipe and pty tests run a script that
replays the phases of a check on that fake clock through a real pipe / pty.
"""

from __future__ import annotations

import io
import itertools
import os
import pty
import re
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.progress import HEARTBEAT_S, POLL_S, PlainProgress, Progress, make_progress, phase, step
from suites.stored_goldens import stored_dir

REPO = Path(__file__).resolve().parents[2]
STAMP = re.compile(r"^\[golden \d\d:\d\d:\d\d \+(\d+\.\d)s\] (.*)$")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run_for(progress: PlainProgress, clock: FakeClock, seconds: float) -> None:
    """Let ``seconds`` of fake time pass, the heartbeat thread's way: a tick every POLL_S."""
    for _ in range(round(seconds / POLL_S)):
        clock.now += POLL_S
        progress.tick()


def lines_of(text: str) -> list[tuple[float, str]]:
    out = []
    for line in text.splitlines():
        match = STAMP.match(line)
        assert match, f"not a timestamped progress line: {line!r}"
        out.append((float(match.group(1)), match.group(2)))
    return out


def test_a_long_phase_emits_heartbeats_and_no_gap_exceeds_the_heartbeat():
    clock, out = FakeClock(), io.StringIO()
    progress = PlainProgress(out, clock=clock, wall=lambda: 0.0)
    progress.phase("spawning 8 policy workers")
    run_for(progress, clock, 21.0)        # a 21 s worker spawn
    progress.phase("initial refit")
    lines = lines_of(out.getvalue())
    beats = [text for _, text in lines if text.startswith("... still spawning 8 policy workers")]
    assert len(beats) == 5                 # at 4, 8, 12, 16, 20 s
    assert beats[0] == "... still spawning 8 policy workers (4.0s in this phase)"
    stamps = [t for t, _ in lines]
    assert max(b - a for a, b in itertools.pairwise(stamps)) <= HEARTBEAT_S


def test_a_line_resets_the_heartbeat():
    clock, out = FakeClock(), io.StringIO()
    progress = PlainProgress(out, clock=clock, wall=lambda: 0.0)
    progress.phase("starting Ray")
    for _ in range(5):                     # a note every 3 s: never 4 s of silence, so no heartbeat
        run_for(progress, clock, 3.0)
        progress.note("still fine")
    assert "... still" not in out.getvalue()


def test_steps_report_elapsed_and_eta_from_the_mean_step_time():
    clock, out = FakeClock(), io.StringIO()
    progress = PlainProgress(out, clock=clock, wall=lambda: 0.0)
    for index, duration in ((1, 2.0), (2, 4.0), (3, 3.0)):
        progress.step(index, 4)
        clock.now += duration
    progress.step(4, 4)
    texts = [text for _, text in lines_of(out.getvalue())]
    assert texts[0] == "step 1/4 (elapsed 0.0s, ETA ?)"
    assert texts[1] == "step 2/4 (elapsed 2.0s, ETA 6.0s)"      # mean 2 s x 3 steps left
    assert texts[3] == "step 4/4 (elapsed 9.0s, ETA 3.0s)"      # mean 3 s x 1 step left
    run_for(progress, clock, 4.0)
    assert lines_of(out.getvalue())[-1][1] == "... still step 4/4 (elapsed 13.0s, ETA 0.0s)"


def test_phase_and_step_accept_a_plain_callable_or_none():
    said = []
    phase(said.append, "postflight")
    step(said.append, 1, 3)                # a plain callable has no steps: nothing said
    phase(None, "ignored")
    step(None, 1, 3)
    assert said == ["postflight"]


def test_quiet_and_off_are_silent(monkeypatch, capsys):
    assert type(make_progress(quiet=True)) is Progress
    monkeypatch.setenv("GOLDEN_PROGRESS", "off")
    silent = make_progress()
    silent.phase("starting Ray")
    silent.note("x")
    assert type(silent) is Progress and capsys.readouterr().err == ""


def test_progress_module_imports_no_rich_torch_or_ray():
    code = "import sys, harness.progress; print(sorted(m for m in ('rich', 'torch', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# A check's phases replayed on a fake clock: "spawning 8 policy workers" takes 13 s.
SCRIPT = textwrap.dedent("""
    import sys
    from harness.progress import PlainProgress, make_progress, phase, step
    now = [0.0]
    clock = lambda: now[0]
    progress = make_progress(clock=clock, heartbeat=False)
    print("reporter:", "plain" if isinstance(progress, PlainProgress) else type(progress).__name__)
    def wait(seconds):
        for _ in range(int(seconds / 0.5)):
            now[0] += 0.5
            if hasattr(progress, "tick"):
                progress.tick()
    for name, seconds in (("loading torch and ray", 6), ("starting Ray", 5), ("spawning 8 policy workers", 13),
                          ("initial refit", 1)):
        phase(progress, name)
        wait(seconds)
    for i in (1, 2, 3):
        step(progress, i, 3)
        wait(2)
        progress.note(f"step {i}/3: loss=0.1")
    phase(progress, "postflight")
    wait(1)
    phase(progress, "compare")
    progress.close()
    print("REPORT: PARITY")
""")

PHASES = ["loading torch and ray", "starting Ray", "spawning 8 policy workers", "initial refit",
          "step 1/3", "step 2/3", "step 3/3", "postflight", "compare"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GOLDEN_PROGRESS"}
    return {**env, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", "COLUMNS": "100"}


def test_plain_mode_through_a_pipe_shows_every_phase_with_bounded_gaps():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=_env(),
                            check=True, timeout=60)
    assert result.stdout == "reporter: plain\nREPORT: PARITY\n"     # nothing of the progress on stdout
    lines = lines_of(result.stderr)
    texts = [text for _, text in lines]
    positions = [next(i for i, t in enumerate(texts) if t.startswith(p)) for p in PHASES]
    assert positions == sorted(positions), texts
    assert sum(t.startswith("... still spawning 8 policy workers") for t in texts) == 3   # 4, 8, 12 s
    stamps = [t for t, _ in lines]
    assert max(b - a for a, b in itertools.pairwise(stamps)) <= HEARTBEAT_S


def _run_in_pty(argv: list[str], env: dict, timeout: float = 60.0) -> tuple[str, str, int]:
    """Run with stderr on a pty (a terminal) and stdout on a pipe; (stdout, terminal text, rc)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env,
                            cwd=REPO)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            pytest.fail("no terminal output for a whole timeout")
        try:
            data = os.read(master, 65536)
        except OSError:                       # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = proc.stdout.read().decode()
    proc.stdout.close()
    return out, b"".join(chunks).decode(errors="replace"), proc.wait(timeout=timeout)


def test_terminal_mode_in_a_pty_is_a_live_display_with_every_phase():
    out, terminal, rc = _run_in_pty([sys.executable, "-c", SCRIPT], _env())
    assert rc == 0 and out == "reporter: RichProgress\nREPORT: PARITY\n"
    assert "\x1b[" in terminal                  # a live display: cursor control and colour
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal)
    for name in PHASES[:4] + ["postflight", "compare"]:
        assert name in text, name
    assert "step 3/3" in text and "ETA" in text
    assert "[golden" not in text                # not the plain lines


pytest_plugins = ["pytester"]

INNER = textwrap.dedent("""
    def test_progress_bypasses_capture(golden):
        progress = golden._progress("w")
        progress.phase("spawning 8 policy workers")
        progress.close()
        print("captured stdout of a passing test")
""")


def test_under_pytest_progress_reaches_the_terminal_while_output_is_captured(pytester, monkeypatch):
    monkeypatch.delenv("GOLDEN_PROGRESS", raising=False)
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark", "-p", "no:xdist")
    result.assert_outcomes(passed=1)
    err = result.stderr.str()
    assert re.search(r"\[golden w \d\d:\d\d:\d\d \+\d+\.\ds\] spawning 8 policy workers", err), err
    assert "captured stdout of a passing test" not in result.stdout.str()   # capture itself still on


@pytest.mark.slow
def test_a_real_check_in_a_terminal_shows_its_phases_on_stderr_and_only_the_report_on_stdout(tmp_path):
    """One real `golden check` of the smoke workload, stderr on a pty: the live display names
    every phase; stdout (a pipe) holds the report and nothing of the progress."""
    env = {**_env(), "RAY_AUTH_MODE": "disabled"}
    env.pop("GOLDEN_PLATFORM", None)
    argv = [sys.executable, "-m", "harness.cli", "check", "qwen3_moe_tiny_smoke", "--run-dir", str(tmp_path / "run")]
    out, terminal, rc = _run_in_pty(argv, env, timeout=300)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal)
    assert rc == 0, text
    for name in ("loading torch and ray", "starting Ray", "spawning 1 policy workers", "spawning 1 rollout engine",
                 "initial refit", "step 1/3", "step 3/3", "postflight", "compare"):
        assert name in text, (name, text)
    assert out.startswith(f"qwen3_moe_tiny_smoke [{stored_dir('qwen3_moe_tiny_smoke').name}]: PARITY")
    assert "golden provenance: captured" in out
    assert "loading torch" not in out and "step 1/3" not in out
