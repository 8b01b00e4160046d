"""Parity engine: lanes, statuses, findings, fast path and renderers."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET

import pytest

import harness.parity.comparison as engine
from harness.parity import ToleranceFileError, ToleranceTable, compare, parse_tolerances
from harness.parity.render import render, render_terminal
from harness.parity.synthetic import synthetic_surfaces
from harness.surfaces import ToleranceRule


@pytest.fixture
def docs():
    return synthetic_surfaces("w", seed=3)


def _metrics(docs, step="step0001"):
    return docs["training"]["sections"][step]["metrics"]


def test_identical_documents_are_parity(docs):
    verdict = compare(docs, copy.deepcopy(docs))
    assert verdict.status == "parity" and verdict.findings == []
    assert verdict.surfaces["collectives"].sections_compared == 6


def test_fast_path_diffs_only_sections_whose_digest_differs(docs, monkeypatch):
    seen = []
    real = engine.diff_section
    monkeypatch.setattr(engine, "diff_section", lambda s, g, a: seen.append(1) or real(s, g, a))
    actual = copy.deepcopy(docs)
    actual["operators"]["sections"]["policy/rank00001"]["phases"]["train/step2"]["operators"]["aten::op_003"] += 7
    verdict = compare(docs, actual)
    assert len(seen) == 1
    (f,) = verdict.findings
    assert (f.surface, f.section, f.coords, f.phase, f.key) == (
        "operators", "policy/rank00001", {"tp": 1, "cp": 0, "dp": 0, "pp": 0}, "train/step2", "/operators/aten::op_003")
    assert f.actual - f.golden == 7 and f.abs_err == 7 and f.lane == "exact" and f.status == "fail"


def test_a_changed_collective_is_one_finding_with_whole_records(docs):
    actual = copy.deepcopy(docs)
    coll = actual["collectives"]["sections"]["policy/rank00003"]["phases"]["train/step1"]["collectives"]
    golden_record = list(coll[2])
    coll[2] = ["all_to_all_single", "ep", "bfloat16", 12]
    (f,) = compare(docs, actual).findings
    assert f.kind == "changed" and f.key == "/collectives/2"
    assert f.golden == golden_record and f.actual == ["all_to_all_single", "ep", "bfloat16", 12]


def test_missing_and_extra_sections_and_surfaces(docs):
    actual = copy.deepcopy(docs)
    del actual["lifecycle"]["sections"]["rollout/rank00001"]
    actual["training"]["sections"]["step0009"] = {"step": 9, "metrics": {"loss": 0.0}}
    del actual["rollouts"]
    kinds = {(f.surface, f.section, f.kind) for f in compare(docs, actual).findings}
    assert kinds == {("lifecycle", "rollout/rank00001", "removed"), ("training", "step0009", "added"),
                     ("rollouts", None, "removed")}


def test_stale_golden_on_deterministic_platform(docs):
    actual = copy.deepcopy(docs)
    _metrics(actual)["loss"] *= 1.0001  # inside the 1% nondeterministic band
    verdict = compare(docs, actual, deterministic=True)
    (f,) = verdict.findings
    assert verdict.status == "stale" and f.status == "stale" and f.lane == "exact" and f.tolerance["inside"]
    assert "stale golden" in render_terminal(verdict, color=False).lower()
    assert compare(docs, actual, deterministic=False).status == "parity"


def test_out_of_band_fails_in_both_modes(docs):
    actual = copy.deepcopy(docs)
    _metrics(actual)["loss"] += 5.0
    for deterministic in (True, False):
        (f,) = compare(docs, actual, deterministic=deterministic).findings
        assert f.status == "fail" and f.rel_err == pytest.approx(abs(5.0 / _metrics(docs)["loss"]))


def test_informational_surfaces_never_fail_the_gate(docs):
    actual = copy.deepcopy(docs)
    actual["timings"]["sections"]["policy/rank00000"]["phases"]["train/step1"]["wall_s"] += 0.1  # in band
    actual["memory"]["sections"]["policy/rank00000"]["phases"]["train/step1"]["peak_bytes"] *= 3  # out of band
    verdict = compare(docs, actual)
    assert [f.status for f in verdict.findings] == ["info"]
    assert verdict.status == "parity"
    from harness.parity.render import render_terminal

    quiet = render_terminal(verdict, color=False)
    assert "memory: 1 informational finding(s), not gated" in quiet and "peak_bytes" not in quiet
    assert "peak_bytes" in render_terminal(verdict, color=False, show_info=True)


def test_workload_overrides_come_before_defaults(docs):
    actual = copy.deepcopy(docs)
    _metrics(actual)["loss"] *= 1.0001
    strict = ToleranceTable([ToleranceRule("training", "metrics.loss", reason="bitwise on this platform")])
    (f,) = compare(docs, actual, tolerances=strict, deterministic=False).findings
    assert f.status == "fail" and f.lane == "tolerance"


def test_type_changes_and_negative_zero_are_findings():
    g = {"training": {"surface": "training", "version": 1, "workload": "w",
                      "sections": {"step0001": {"metrics": {"a": 1, "b": 0.0}}}}}
    a = copy.deepcopy(g)
    a["training"]["sections"]["step0001"]["metrics"].update(a=True, b=-0.0)
    findings = {f.key: f.kind for f in compare(g, a).findings}
    assert findings == {"/metrics/a": "type", "/metrics/b": "changed"}  # -0.0 == 0.0 in Python, not in bytes
    a["training"]["sections"]["step0001"]["metrics"]["a"] = 1
    (f,) = compare(g, a).findings
    assert f.key == "/metrics/b" and f.kind == "changed"


def test_unknown_surface_and_mislabelled_document_are_unusable(docs):
    with pytest.raises(ValueError, match="unknown surface 'losses'"):
        compare({"losses": {}}, {"losses": {}})
    with pytest.raises(ValueError, match="says surface='training'"):
        compare({"rollouts": docs["training"]}, {"rollouts": docs["training"]})


def test_renderers(docs):
    actual = copy.deepcopy(docs)
    _metrics(actual)["loss"] += 1.0
    actual["memory"]["sections"]["policy/rank00000"]["phases"]["train/step1"]["peak_bytes"] *= 3
    verdict = compare(docs, actual)
    text = render(verdict, "terminal", color=False)
    assert "\x1b[" not in text and "FAIL" in text and "/metrics/loss" in text
    assert "\x1b[31m" in render(verdict, "terminal", color=True)
    md = render(verdict, "markdown")
    assert "| training | yes | **fail** |" in md
    payload = json.loads(render(verdict, "json"))
    assert payload["status"] == "fail" and payload["counts"] == {"fail": 1, "stale": 0, "info": 1}
    root = ET.fromstring(render(verdict, "junit"))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == set(docs)
    assert cases["training"].find("failure") is not None and "/metrics/loss" in cases["training"].find("failure").text
    assert cases["memory"].find("failure") is None and cases["memory"].find("system-out") is not None


def test_terminal_colour_follows_tty_and_no_color(monkeypatch):
    from harness.parity.render.terminal import use_color

    class Tty:
        def isatty(self):
            return True

    class Pipe:
        def isatty(self):
            return False

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_color(Tty())
    assert not use_color(Pipe())  # a pipe or file gets no escape codes
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(Tty())


@pytest.mark.parametrize("doc,field", [
    ({"rules": [{"surface": "training", "key": "metrics.loss"}]}, "rules[0].reason"),
    ({"rules": [{"surface": "nope", "key": "x", "reason": "r"}]}, "rules[0].surface"),
    ({"rules": [{"surface": "training", "key": "x", "reason": "r", "rel": -1}]}, "rules[0].rel"),
    ({"rules": [{"surface": "training", "key": "x", "reason": "r", "abs": float("nan")}]}, "rules[0].abs"),
    ({"rules": [{"surface": "training", "key": "x", "reason": "r", "when": "sometimes"}]}, "rules[0].when"),
    ({"version": 2}, "version"),
    ({"deterministic": "yes"}, "deterministic"),
])
def test_tolerance_file_errors_name_the_field(doc, field):
    with pytest.raises(
        ToleranceFileError, match=rf"golden/tolerances.yaml: {field.replace('[', '.').replace(']', '.')}"
    ):
        parse_tolerances(doc, source="golden/tolerances.yaml")


def test_tolerance_file_parses():
    parsed = parse_tolerances({"version": 1, "deterministic": False, "rules": [
        {"surface": "training", "key": "metrics.loss", "section": "step*", "rel": 1e-5,
         "reason": "observed 3e-6 over 20 runs", "evidence": {"runs": 20}}]})
    assert parsed.deterministic is False
    assert parsed.rules[0].matches("training", "step0002", "metrics.loss")
