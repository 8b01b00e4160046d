"""Step times beside the verdict (harness.parity.step_times and the renderers that show them).

The figures are informational: these tests check what is read (top-level driver phases
per step, both sides, nothing invented) and that every human format and JSON shows them,
never that a time is small.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.parity.comparison import compare
from harness.parity.render import render
from harness.parity.step_times import step_times, table_rows

ROOT = Path(__file__).resolve().parents[2]


def _timings(phases: dict[str, float]) -> dict:
    return {"surface": "timings", "version": 1, "workload": "w",
            "sections": {"driver": {"phases": {k: {"wall_s": v} for k, v in phases.items()}},
                         "policy/rank00000": {"phases": {"train/step1": {"wall_s": 9.0}}}}}


GOLDEN = _timings({"step0001/generation": 1.0, "step0001/refit": 0.5, "step0001/refit/send": 0.4,
                   "step0001/total_step_time": 2.0, "step0002/generation": 1.0, "step0002/total_step_time": 2.0})
ACTUAL = _timings({"step0001/generation": 1.5, "step0001/refit": 0.25, "step0001/refit/send": 0.2,
                   "step0001/total_step_time": 3.0, "step0002/generation": 2.0, "step0002/total_step_time": 4.0,
                   "step0003/generation": 1.0})


def test_reads_the_top_level_driver_phases_of_both_sides_with_the_total_last():
    times = step_times(GOLDEN, ACTUAL)
    assert times.phases == ("generation", "refit", "total_step_time")  # refit/send and rank sections left out
    assert times.steps == (1, 2, 3)
    assert times.cell("generation", 1) == (1.0, 1.5)
    assert times.cell("refit", 2) == (None, None)
    assert times.cell("generation", 3) == (None, 1.0)  # a step only the run has
    assert times.totals("generation") == (2.0, 3.5)    # summed where both sides have it
    assert times.totals("total_step_time") == (4.0, 7.0)


def test_table_rows_show_both_sides_missing_cells_and_the_ratio():
    rows = table_rows(step_times(GOLDEN, ACTUAL))
    assert rows[0] == ["step", "generation", "refit", "total_step_time"]
    assert rows[1] == ["1", "1.00 -> 1.50", "0.50 -> 0.25", "2.00 -> 3.00"]
    assert rows[3] == ["3", "- -> 1.00", "- -> -", "- -> -"]
    assert rows[-1] == ["sum", "2.00 -> 3.50 x1.75", "0.50 -> 0.25 x0.50", "4.00 -> 7.00 x1.75"]
    assert table_rows(step_times(GOLDEN, ACTUAL), limit=1)[2][0] == "... 2 more"


def test_no_table_without_a_driver_section_on_either_side():
    no_driver = {"surface": "timings", "version": 1, "workload": "w", "sections": {}}
    assert step_times(GOLDEN, None) is None
    assert step_times(None, ACTUAL) is None
    assert step_times(GOLDEN, no_driver) is None
    assert step_times(no_driver, ACTUAL) is None


def test_every_format_but_junit_shows_them_and_the_verdict_is_unchanged():
    verdict = compare({"timings": GOLDEN}, {"timings": ACTUAL})
    times = step_times(GOLDEN, ACTUAL)
    formats = ("terminal", "markdown", "json", "html")
    plain = {fmt: render(verdict, fmt, color=False) for fmt in formats}
    shown = {fmt: render(verdict, fmt, color=False, step_times=times) for fmt in formats}
    assert "4.00 -> 7.00 x1.75" in shown["terminal"] and "4.00 -> 7.00" not in plain["terminal"]
    assert "| sum | 2.00 -> 3.50 x1.75 |" in shown["markdown"]
    assert 'id="step-times"' in shown["html"] and 'id="step-times"' not in plain["html"]
    doc = json.loads(shown["json"])
    assert doc["step_times"]["steps"][0]["generation"] == {"golden": 1.0, "actual": 1.5}
    assert "step_times" not in json.loads(plain["json"])
    assert doc["status"] == json.loads(plain["json"])["status"]


def test_golden_diff_of_a_golden_with_itself_prints_its_step_times(tmp_path):
    golden = ROOT / "goldens" / "qwen3_moe_tiny_smoke" / "cpu"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "diff", str(golden), "qwen3_moe_tiny_smoke",
                           "--format", "json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    stored = json.loads((golden / "surfaces" / "timings.json").read_text())
    first = doc["step_times"]["steps"][0]
    want = stored["sections"]["driver"]["phases"]["step0001/total_step_time"]["wall_s"]
    assert first["step"] == 1 and first["total_step_time"] == {"golden": want, "actual": want}
