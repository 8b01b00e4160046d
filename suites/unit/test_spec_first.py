"""The spec first (``harness.parity.spec_check``): a run whose workload spec differs from the
golden's is told so in its first finding, naming the fields, in every report format, and
``golden check`` / the pytest plugin decide it before anything starts.

The goldens here are copies of the repository's smoke golden with the spec it was captured
from recorded, as ``golden capture`` now records it (``PROVENANCE.json`` ``spec``); then the
consumer changes the seed. No workload runs: the verdict comes before Ray (< 2 s).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.parity.findings import Finding, SurfaceResult, Verdict
from harness.parity.render import render
from harness.parity.spec_check import ABSENT, compare_specs, spec_changes
from suites.inner_golden import REPO, SMOKE
from suites.stored_goldens import copy_stored

pytest_plugins = ["pytester"]

GOLDEN = ["golden", "check", SMOKE]


def _golden_with_its_spec(root: Path) -> Path:
    """A copy of the smoke golden under ``root`` recording the spec it compares as (as a golden
    stored now does), with the spec copied beside it."""
    from harness import flows
    from harness.spec.load import spec_digest

    target = copy_stored(SMOKE, root)
    shutil.copy(REPO / "goldens" / SMOKE / "workload.yaml", root / SMOKE / "workload.yaml")
    spec = flows.spec_for_platform(SMOKE, (), None, root)
    provenance = json.loads((target / "PROVENANCE.json").read_text())
    provenance["spec"] = spec.to_dict()
    (target / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2, sort_keys=True))
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["workload"]["spec_digest"] = spec_digest(spec)
    (target / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, separators=(",", ":")))
    return target


def _change_seed(root: Path) -> None:
    spec = root / SMOKE / "workload.yaml"
    spec.write_text(spec.read_text().replace("seed: 1234", "seed: 1235"))


def test_changed_fields_are_named_and_only_a_change_of_a_known_field_gates():
    golden = {"seed": 1234, "rollout": {"tp": 1, "max_new_tokens": 16}, "old": True}
    run = {"seed": 1235, "rollout": {"tp": 1, "max_new_tokens": 16}, "new": "x"}
    assert spec_changes(golden, run) == [f"new: {ABSENT} -> x", f"old: true -> {ABSENT}", "seed: 1234 -> 1235"]
    diff = compare_specs("a" * 64, golden, "b" * 64, run)
    assert diff.gating and diff.headline.startswith("spec: the workload spec differs from the golden's: new:")
    assert compare_specs("a" * 64, golden, "a" * 64, run) is None  # same digest: nothing to say
    added = compare_specs("a" * 64, {"seed": 1}, "b" * 64, {"seed": 1, "distill": None})
    assert not added.gating and added.status == "info"  # a field new since the capture (a schema default)
    digest_only = compare_specs("a" * 64, None, "b" * 64, run)
    assert not digest_only.gating and "records only the digest" in digest_only.headline
    assert compare_specs(None, golden, "b" * 64, run) is None
    scheduling = compare_specs("a" * 64, {"platform": {"platforms": ["cpu", "cuda"]}, "description": "x"},
                               "b" * 64, {"platform": {"platforms": ["cpu"]}, "description": "y"})
    assert scheduling is None  # prose and the scheduled platforms do not change a run


def _verdict_with_a_surface_finding(spec) -> Verdict:
    finding = Finding(surface="training", section="step0001", kind="changed", lane="exact", status="fail",
                      key="/metrics/loss", path=("metrics", "loss"), golden=1.0, actual=2.0)
    surface = SurfaceResult(name="training", gated=True, findings=[finding], sections_compared=1,
                            sections_differing=1)
    return Verdict(deterministic=True, surfaces={"training": surface}, spec=spec)


@pytest.mark.parametrize("fmt", ["terminal", "markdown", "json", "html", "junit"])
def test_every_report_shows_the_spec_before_any_surface_finding(fmt):
    spec = compare_specs("a" * 64, {"seed": 1234}, "b" * 64, {"seed": 1235})
    extra = {"color": False} if fmt == "terminal" else {}
    report = render(_verdict_with_a_surface_finding(spec), fmt, title="t", **extra)
    if fmt in ("html", "junit"):
        import html

        report = html.unescape(report)
    assert "seed: 1234 -> 1235" in report
    first_surface = {"terminal": "training:", "markdown": "training: 1 finding", "json": '"surfaces"',
                     "html": 'id="summary"', "junit": 'name="training"'}[fmt]
    assert report.index("seed: 1234 -> 1235") < report.index(first_surface), report[:2000]
    if fmt == "json":
        doc = json.loads(report)
        assert doc["status"] == "fail" and doc["spec"]["changes"] == ["seed: 1234 -> 1235"]


def test_golden_check_names_the_changed_seed_before_running(tmp_path: Path):
    root = tmp_path / "goldens"
    _golden_with_its_spec(root)
    golden = [sys.executable, "-m", "harness.cli", "check", SMOKE, "--goldens-root", str(root)]
    _change_seed(root)
    proc = subprocess.run(golden, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    findings = [line for line in proc.stdout.splitlines() if line.startswith(("FAIL", "NOTE"))]
    assert findings[0] == "FAIL spec: the workload spec differs from the golden's: seed: 1234 -> 1235", proc.stdout
    assert "fail before any run" in proc.stderr and f"golden refresh {SMOKE} --platform cpu" in proc.stderr
    # before any run, shown by what did not happen (no Ray, no run directory), not by a time bound
    assert "starting Ray" not in proc.stderr and not (tmp_path / "runs").exists()
    for fmt in ("json", "html"):
        out = tmp_path / f"report.{fmt}"
        proc = subprocess.run([*golden, "--output", str(out)], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr
        import html

        text = html.unescape(out.read_text())
        assert "seed: 1234 -> 1235" in text
        if fmt == "json":
            assert json.loads(text)["spec"]["changes"] == ["seed: 1234 -> 1235"]
        else:
            assert text.index('id="spec"') < text.index('id="summary"')


def test_the_pytest_plugin_fails_every_surface_on_the_spec_before_ray(pytester: pytest.Pytester, monkeypatch):
    from suites.inner_golden import INNER_GOLDEN_TEST

    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    monkeypatch.delenv("GOLDEN_ROOT", raising=False)
    root = pytester.path / "goldens"
    _golden_with_its_spec(root)
    _change_seed(root)
    pytester.makepyfile(test_inner=INNER_GOLDEN_TEST.format(root=str(root)))
    result = pytester.runpytest_subprocess("-m", "golden", "-p", "no:cacheprovider", f"--goldens-root={root}")
    result.assert_outcomes(failed=7)  # one test per gated surface, numerics included
    out = result.stdout.str()
    assert out.count("seed: 1234 -> 1235") >= 6 and "fail before any run" in out
    assert "Started a local Ray instance" not in out + result.stderr.str()  # before Ray: no time bound needed
