"""harness.store.variants: one CPU golden per CPU numerics key, and how check/refresh pick it."""

from __future__ import annotations

import pytest

from harness import flows
from harness.parity.synthetic import synthetic_manifest, synthetic_surfaces
from harness.store import new_provenance, write_golden
from harness.store.layout import check_name
from harness.store.lint import lint
from harness.store.variants import mismatch_note, read_platform, recorded_key, unrecorded_note, write_platform

W = "w"


def _golden(root, platform: str, key: str | None) -> None:
    manifest = synthetic_manifest(W)
    if key is not None:
        manifest["environment"]["cpu_numerics"] = {"key": key, "vendor": "GenuineIntel", "family": 6, "model": 1,
                                                   "model_name": None, "overrides": {}}
    write_golden(root, W, platform, manifest, synthetic_surfaces(W),
                 new_provenance(commit=None, reason="test", command="test", environment={}))


def _workload(root) -> None:
    (root / W).mkdir()
    (root / W / "workload.yaml").write_text(
        f"name: {W}\nmodel: {{layers: 4, hidden: 64, heads: 8, kv_heads: 2, head_dim: 16, experts: 8,"
        " top_k: 2, moe_intermediate: 32, vocab: 256}\nplatform: {platforms: [cpu]}\n")


def test_platform_names_carry_at_most_one_key():
    assert check_name("platform", "cpu@intel-f6m167") == "cpu@intel-f6m167"
    for bad in ("cpu@", "cpu@a@b", "@k", "cpu@.x"):
        with pytest.raises(ValueError):
            check_name("platform", bad)
    with pytest.raises(ValueError):
        check_name("workload", "w@k")  # only platforms are qualified


def test_reads_the_own_variant_first_then_an_agreeing_or_unrecorded_golden(tmp_path):
    assert read_platform(tmp_path, W, "cpu", "k1") == "cpu"  # nothing stored: a first capture writes cpu
    _golden(tmp_path, "cpu", None)
    assert recorded_key(tmp_path, W, "cpu") is None
    assert read_platform(tmp_path, W, "cpu", "k1") == "cpu"  # unrecorded: compared as before keys existed
    _golden(tmp_path, "cpu", "k1")
    assert recorded_key(tmp_path, W, "cpu") == "k1"
    assert read_platform(tmp_path, W, "cpu", "k1") == "cpu"
    assert read_platform(tmp_path, W, "cpu", "k2") == "cpu@k2"  # never compared across numerics
    _golden(tmp_path, "cpu@k2", "k2")
    assert read_platform(tmp_path, W, "cpu", "k2") == "cpu@k2"
    assert read_platform(tmp_path, W, "cpu", None) == "cpu"  # a non-CPU run is never split
    assert read_platform(tmp_path, W, "cpu@k1", "k2") == "cpu@k1"  # a qualified name is used as given


def test_a_golden_on_other_numerics_is_missing_and_says_whose_it_is(tmp_path):
    _golden(tmp_path, "cpu", "amd-f25m17")
    stored = read_platform(tmp_path, W, "cpu", "intel-f6m167")
    with pytest.raises(flows.GoldenMissing) as err:
        flows.load_golden(tmp_path, W, stored)
    text = str(err.value)
    assert "'cpu@intel-f6m167'" in text and "captured on CPU numerics 'amd-f25m17'" in text
    assert "golden capture w --platform cpu" in text  # the hint names the scheduled platform
    assert mismatch_note(tmp_path, W, "cpu") == ""


def test_writes_beside_an_unrecorded_golden_only_when_asked(tmp_path):
    _golden(tmp_path, "cpu", None)
    assert write_platform(tmp_path, W, "cpu", "k1") == "cpu"  # a refresh replaces it (and records k1)
    assert write_platform(tmp_path, W, "cpu", "k1", beside=True) == "cpu@k1"
    _golden(tmp_path, "cpu", "k1")
    assert write_platform(tmp_path, W, "cpu", "k1", beside=True) == "cpu"  # recorded and equal: replace
    assert write_platform(tmp_path, W, "cpu", "k2") == "cpu@k2"  # recorded on other numerics: a new variant


def test_lint_counts_a_variant_for_its_platform(tmp_path):
    _workload(tmp_path)
    _golden(tmp_path, "cpu@k2", "k2")
    assert [f.kind for f in lint(tmp_path)] == []
    _golden(tmp_path, "cuda@k2", None)
    assert [(f.kind, f.path) for f in lint(tmp_path)] == [("unscheduled_golden", "w/cuda@k2")]


def test_check_refuses_a_golden_of_other_numerics_before_running(tmp_path, monkeypatch, capsys):
    """`golden check` on a machine whose key the stored golden does not record: exit 2 before
    anything starts, naming both keys (not a flood of rounding findings after a run)."""
    import harness.numerics
    from harness.cli import EXIT_USAGE, main

    def refuse(*args, **kwargs):  # test double: the workload must not start
        raise AssertionError("the workload must not start")

    monkeypatch.setattr(flows, "execute", refuse)
    monkeypatch.setattr(harness.numerics, "cpu_numerics", lambda *a, **k: {"key": "intel-f6m167"})
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    _workload(tmp_path)
    _golden(tmp_path, "cpu", "amd-f25m17")
    code = main(["check", W, "--goldens-root", str(tmp_path), "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert "on platform 'cpu@intel-f6m167'" in err and "captured on CPU numerics 'amd-f25m17'" in err
    assert not (tmp_path / "run").exists()


def test_doctor_names_the_golden_this_machine_compares_with(tmp_path, monkeypatch, capsys):
    import harness.numerics
    from harness.cli import main

    monkeypatch.setattr(harness.numerics, "cpu_numerics", lambda *a, **k: {"key": "intel-f6m167"})
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    _workload(tmp_path)
    _golden(tmp_path, "cpu", "amd-f25m17")
    assert main(["doctor", W, "--goldens-root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "golden: w [cpu@intel-f6m167] is MISSING" in out and "captured on CPU numerics 'amd-f25m17'" in out
    _golden(tmp_path, "cpu@intel-f6m167", "intel-f6m167")
    assert main(["doctor", W, "--goldens-root", str(tmp_path)]) == 0
    assert "golden: w [cpu@intel-f6m167]" in capsys.readouterr().out


def test_list_shows_a_variant_under_its_platform_with_each_goldens_numerics(tmp_path, capsys):
    import json

    from harness.cli import main

    _workload(tmp_path)
    _golden(tmp_path, "cpu", None)
    _golden(tmp_path, "cpu@k2", "k2")
    assert main(["list", "--json", "--goldens-root", str(tmp_path)]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["workloads"]
    assert entry["stored"] == ["cpu"] and entry["variants"] == ["cpu@k2"] and entry["unscheduled"] == []
    assert entry["provenance"]["cpu"]["cpu_numerics"] is None
    assert entry["provenance"]["cpu@k2"]["cpu_numerics"] == "k2"
    assert main(["list", "--goldens-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cpu@k2: golden (CPU-numerics variant)" in out and "; CPU numerics k2" in out


def test_a_failed_check_against_an_unrecorded_golden_says_the_numerics_may_differ(tmp_path):
    assert unrecorded_note(tmp_path, W, "cpu", "intel-f6m167") == ""  # nothing stored
    _golden(tmp_path, "cpu", None)
    note = unrecorded_note(tmp_path, W, "cpu", "intel-f6m167")
    assert "records no CPU numerics" in note and "'intel-f6m167'" in note
    assert f"golden refresh {W} --platform cpu --numerics-variant --reason TEXT" in note
    assert unrecorded_note(tmp_path, W, "cpu", None) == ""  # a run without a key (cuda): nothing to say
    _golden(tmp_path, "cpu@k2", "k2")
    assert unrecorded_note(tmp_path, W, "cpu@k2", "k2") == ""  # a variant always records its key
    _golden(tmp_path, "cpu", "amd-f25m17")
    assert unrecorded_note(tmp_path, W, "cpu", "amd-f25m17") == ""  # recorded and equal: a real change
