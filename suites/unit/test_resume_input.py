"""`golden run --resume RUN_DIR` on a run directory it cannot resume from: exit 2 naming
run.json and the field, never a traceback; and on a good one the stored spec comes back as
the same Workload (same digest), validated like a workload file.

No workload runs here: every case is refused (or read) before Ray would start.
"""

from __future__ import annotations

import json

import pytest

from harness import flows
from harness.cli import main
from harness.spec import load_spec
from harness.spec.load import spec_digest
from harness.spec.typed import Workload

SMOKE = "qwen3_moe_tiny_smoke"


def resume(run_dir, capsys) -> tuple[int, str]:
    code = main(["run", "--resume", str(run_dir)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize("text, named", [
    ('{"spec": 3}', "run.json#/spec: (root): a workload spec must be a mapping, got int"),
    ('{"spec": {"name": "x"}}', "run.json#/spec: model: required field is missing"),
    ('[1, 2]', "holds no spec (#/spec)"),
    ('{"status": "stopped"}', "holds no spec (#/spec)"),
    ('{"spec":', "run.json#/spec: expected a JSON value"),
    ('{"spec": {}, "spec": {}}', "duplicate"),
])
def test_a_run_json_that_cannot_be_resumed_from_is_refused_naming_the_field(tmp_path, capsys, text, named):
    (tmp_path / "run.json").write_text(text)
    code, err = resume(tmp_path, capsys)
    assert code == 2, err
    assert named in err


def test_a_stored_spec_that_breaks_a_layout_rule_is_refused_before_anything_starts(tmp_path, capsys):
    spec = load_spec(SMOKE).to_dict()
    spec["model"]["kv_heads"] = spec["model"]["heads"] + 1  # heads % kv_heads != 0
    (tmp_path / "run.json").write_text(json.dumps({"spec": spec}))
    code, err = resume(tmp_path, capsys)
    assert code == 2 and "run.json#/spec" in err and "kv_heads" in err, err


def test_a_directory_without_run_json_is_not_a_run(tmp_path, capsys):
    code, err = resume(tmp_path, capsys)
    assert code == 2 and "no run.json" in err


def test_the_stored_spec_comes_back_as_the_same_workload(tmp_path):
    original = load_spec(SMOKE)
    (tmp_path / "run.json").write_text(json.dumps({"spec": original.to_dict(), "status": "stopped"}))
    resumed = flows.resumed_spec(tmp_path)
    assert isinstance(resumed, Workload) and resumed.name == SMOKE
    assert spec_digest(resumed) == spec_digest(original)
