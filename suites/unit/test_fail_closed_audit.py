"""Fail-closed audit: inputs the gate used to accept (a verdict on nothing or on a golden it
could not fully trust) or crashed on, each now refused as unusable input naming the file
and field, never with a traceback.

Real run directories and goldens (`suites/run_dirs.py`, `write_golden`), damaged the way a
hand edit, a truncated copy or a bad merge leaves them, then the real `golden` command
in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.parity.synthetic import synthetic_surfaces
from harness.parity.tolerances import ToleranceFileError, parse_tolerances
from harness.store import new_provenance, write_golden
from harness.store.golden import GoldenStoreError
from harness.surfaces import surface_file_bytes
from harness.surfaces.digest import sha256_hex
from suites.run_dirs import make_run, read_manifest, write_manifest


def _provenance() -> dict:
    return new_provenance(commit=None, reason="test", command="pytest", environment={})


@pytest.fixture
def world(tmp_path):
    docs = synthetic_surfaces("w", seed=5)
    run = make_run(tmp_path / "run", docs)
    golden = write_golden(tmp_path / "goldens", "w", "cpu", read_manifest(run), docs, _provenance())
    (tmp_path / "goldens/w/workload.yaml").write_text("name: w\n")  # lint: not an orphan
    return tmp_path, run, golden, docs


def _golden_manifest(golden: Path, change) -> None:
    manifest = json.loads((golden / "manifest.json").read_text())
    change(manifest)
    (golden / "manifest.json").write_bytes(surface_file_bytes(manifest))


def _golden_surface(golden: Path, name: str, doc: dict) -> None:
    """Replace a stored surface and record its new sha256, as a careless hand edit would."""
    data = surface_file_bytes(doc)
    (golden / "surfaces" / f"{name}.json").write_bytes(data)

    def fix(manifest):
        for entry in manifest["surfaces"]:
            if entry["name"] == name:
                entry["sha256"] = sha256_hex(data)
    _golden_manifest(golden, fix)


def _gate(capsys, args) -> tuple[int, str]:
    """(exit code, stderr + stdout) of one command; never a traceback."""
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.err + captured.out


def _refused_everywhere(capsys, run: Path, golden: Path, root: Path, needle: str) -> None:
    """diff exits 2 naming the problem; validate and lint report it (exit 1)."""
    code, err = _gate(capsys, ["diff", run, golden])
    assert code == 2, err
    assert needle in err and "unusable input" in err
    code, err = _gate(capsys, ["validate", golden])
    assert code == 1
    assert needle in err
    code, _ = _gate(capsys, ["lint", "--goldens-root", root])
    assert code == 1


# --- a gate must not pass on nothing ------------------------------------------------------

def test_a_golden_of_an_empty_gated_surface_is_never_written(world):
    tmp_path, run, _, docs = world
    empty = dict(docs)
    empty["collectives"] = dict(docs["collectives"], sections={})
    with pytest.raises(GoldenStoreError, match="surface collectives: /sections is empty"):
        write_golden(tmp_path / "other", "w", "cpu", read_manifest(run), empty, _provenance())
    assert not (tmp_path / "other/w/cpu").exists()


def test_empty_run_against_empty_golden_is_not_parity(world, tmp_path, capsys):
    # before: both sides with zero sections in every surface -> PARITY, exit 0
    _, _, golden, docs = world
    empty = {name: dict(doc, sections={}) for name, doc in docs.items()}
    for name, doc in empty.items():
        _golden_surface(golden, name, doc)
    run = make_run(tmp_path / "empty_run", empty)
    _refused_everywhere(capsys, run, golden, tmp_path / "goldens", "surfaces/topology.json#/sections: empty")


# --- a stored manifest is read completely --------------------------------------------------

@pytest.mark.parametrize("case, change, needle", [
    ("another workload", lambda m: m["workload"].__setitem__("name", "other"),
     "manifest.json#/workload/name: 'other', expected 'w'"),
    ("an incomplete run", lambda m: m.__setitem__("status", "incomplete"),
     "manifest.json#/status: 'incomplete'"),
    ("a schema violation", lambda m: m.__setitem__("iterations", "two"), "manifest.json#/iterations"),
    ("an absolute artifact path", lambda m: m["artifacts"][0].__setitem__("path", "/etc/passwd"),
     "manifest.json#/artifacts/0/path"),
])
def test_a_golden_manifest_that_is_not_a_complete_run_of_its_workload_is_refused(world, capsys, case, change,
                                                                                  needle):
    # before: diff gave PARITY (exit 0): read_golden checked only schema_version and the surfaces list
    tmp_path, run, golden, _ = world
    _golden_manifest(golden, change)
    code, err = _gate(capsys, ["diff", run, golden])
    assert code == 2, (case, err)
    assert needle in err
    code, _ = _gate(capsys, ["lint", "--goldens-root", tmp_path / "goldens"])
    assert code == 1
    if case in ("another workload", "an incomplete run"):  # validate already caught the schema cases
        code, err = _gate(capsys, ["validate", golden])
        assert code == 1 and needle in err


# --- PROVENANCE.json: a damaged one is unusable input, not a traceback or a silent parity ----

@pytest.mark.parametrize("raw, needle", [
    (b"[]\n", "PROVENANCE.json#/: provenance must be a JSON object"),
    (b"{}\n", "PROVENANCE.json#/commit: commit: required field is missing"),
    ((b'{"commit": 5, "date": [], "reason": {}, "command": 1, "environment": "x", "tolerance_evidence": 3, '
     b'"repository": 7, "versions": "v"}\n'), "PROVENANCE.json#/commit: commit: must be a non-empty string"),
])
def test_a_damaged_provenance_is_unusable_input(world, capsys, raw, needle):
    # before: [] and {} gave PARITY; wrong field types crashed the terminal renderer (exit 3, traceback)
    _, run, golden, _ = world
    (golden / "PROVENANCE.json").write_bytes(raw)
    code, err = _gate(capsys, ["diff", run, golden])
    assert code == 2, err
    assert needle in err


# --- tolerances.yaml ---------------------------------------------------------------------

@pytest.mark.parametrize("doc, field", [
    (None, "empty document"),
    ({"version": True}, "version: True is not supported"),
    ({"version": 1.0}, "version: 1.0 is not supported"),
    ({"version": 1, "rules": 0}, "rules: must be a list"),
    ({"version": 1, "rules": ""}, "rules: must be a list"),
])
def test_parse_tolerances_refuses_what_python_truthiness_let_through(doc, field):
    with pytest.raises(ToleranceFileError, match=field):
        parse_tolerances(doc, source="t.yaml")


@pytest.mark.parametrize("case", ["empty", "version true", "rules zero", "a directory"])
def test_a_golden_tolerances_file_that_does_not_read_is_refused(world, capsys, case):
    # before: each was read as "no overrides" (or, a directory, skipped): PARITY and validate "ok"
    tmp_path, run, golden, _ = world
    path = golden / "tolerances.yaml"
    if case == "a directory":
        path.mkdir()
        needle = "tolerances.yaml: is a directory"
    else:
        path.write_text({"empty": "", "version true": "version: true\n", "rules zero": "version: 1\nrules: 0\n"}[case])
        needle = {"empty": "empty document", "version true": "version: True",
                  "rules zero": "rules: must be a list"}[case]
    code, err = _gate(capsys, ["diff", run, golden])
    assert code == 2, err
    assert "tolerances.yaml" in err and (needle in err or case == "a directory")
    code, err = _gate(capsys, ["validate", golden])
    assert code == 1
    assert "tolerances.yaml" in err
    code, _ = _gate(capsys, ["lint", "--goldens-root", tmp_path / "goldens"])  # lint read no tolerances before
    assert code == 1


# --- files the store never writes ----------------------------------------------------------

@pytest.mark.parametrize("rel", ["junk.bin", "surfaces/notes.txt", "surfaces/old/topology.json"])
def test_a_golden_with_files_the_store_never_writes_is_refused(world, capsys, rel):
    # before: junk.bin and surfaces/old/... were ignored (PARITY, validate ok); surfaces/notes.txt
    # was refused by diff but validate said "ok"
    tmp_path, run, golden, _ = world
    (golden / rel).parent.mkdir(parents=True, exist_ok=True)
    (golden / rel).write_bytes(b"\xff\x00")
    code, err = _gate(capsys, ["diff", run, golden])
    assert code == 2, err
    assert ("surfaces/old" if rel.startswith("surfaces/old") else rel) in err
    code, err = _gate(capsys, ["validate", golden])
    assert code == 1, err
    code, _ = _gate(capsys, ["lint", "--goldens-root", tmp_path / "goldens"])
    assert code == 1


# --- a run whose surfaces are not its manifest's -------------------------------------------

def test_a_run_whose_surfaces_name_another_workload_than_its_manifest_is_unusable(world, capsys):
    # before: manifest workload 'other', surfaces (and golden) 'w' -> PARITY, exit 0
    _, run, golden, _ = world
    manifest = read_manifest(run)
    manifest["workload"]["name"] = "other"
    write_manifest(run, manifest)
    code, err = _gate(capsys, ["diff", run, golden])
    assert code == 2, err
    assert "surfaces/collectives.json#/workload: 'w', but the manifest's /workload/name is 'other'" in err
    assert "nothing was compared" in err


# --- a report never lands in what is compared ----------------------------------------------

@pytest.mark.parametrize("where", ["golden manifest", "new file in golden", "run manifest", "run surface"])
def test_diff_never_writes_its_report_over_what_it_compares(world, capsys, where):
    # before: --output GOLDEN/manifest.json overwrote the golden's manifest with the report (exit 0)
    _, run, golden, _ = world
    target = {"golden manifest": golden / "manifest.json", "new file in golden": golden / "report.json",
              "run manifest": run / "manifest.json", "run surface": run / "surfaces/training.json"}[where]
    before = {p: p.read_bytes() for d in (run, golden) for p in sorted(d.rglob("*")) if p.is_file()}
    code, err = _gate(capsys, ["diff", run, golden, "--output", target, "--format", "json"])
    assert code == 2, err
    assert "--output" in err and ("inside the golden" in err or "a file this comparison reads" in err)
    after = {p: p.read_bytes() for d in (run, golden) for p in sorted(d.rglob("*")) if p.is_file()}
    assert after == before


def test_check_refuses_an_output_inside_its_golden_before_running(tmp_path, monkeypatch, capsys):
    import shutil

    from harness import flows

    def refuse(*args, **kwargs):  # test double: the workload must not start for a usage error
        raise AssertionError("the workload must not start for a usage error")

    monkeypatch.setattr(flows, "execute", refuse)
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    repo, smoke = Path(__file__).resolve().parents[2], "qwen3_moe_tiny_smoke"
    root = tmp_path / "goldens"
    (root / smoke).mkdir(parents=True)
    shutil.copy(repo / "goldens" / smoke / "workload.yaml", root / smoke / "workload.yaml")
    shutil.copytree(repo / "goldens" / smoke / "cpu", root / smoke / "cpu")
    out = root / smoke / "cpu" / "report.html"
    code, err = _gate(capsys, ["check", smoke, "--goldens-root", root, "--output", out, "--run-dir", tmp_path / "r"])
    assert code == 2
    assert "is inside the golden" in err
    assert not out.exists() and not (tmp_path / "r").exists()


def test_a_report_write_that_fails_leaves_no_half_report(tmp_path, monkeypatch):
    from harness.cli import _workload_args

    out = tmp_path / "r.md"
    out.write_text("previous report\n")

    class Boom(OSError):
        pass

    real_fdopen = _workload_args.os.fdopen

    def failing_fdopen(fd, *a, **kw):
        handle = real_fdopen(fd, *a, **kw)
        handle.write("half")
        handle.flush()
        raise Boom("disk full")

    monkeypatch.setattr(_workload_args.os, "fdopen", failing_fdopen)
    with pytest.raises(Boom):
        _workload_args.write_report(out, "a long report\n")
    assert out.read_text() == "previous report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.md"]


# --- golden vs golden ----------------------------------------------------------------------

def test_diff_of_two_goldens_compares_them(world, capsys):
    # before: exit 2 "artifacts/... is missing under <golden>" (a golden stores no artifacts)
    tmp_path, run, golden, docs = world
    same = write_golden(tmp_path / "goldens", "w", "cuda", read_manifest(run), docs, _provenance())
    code, err = _gate(capsys, ["diff", golden, same])
    assert code == 0, err
    changed = json.loads(json.dumps(docs))
    next(iter(changed["training"]["sections"].values()))["metrics"]["loss"] = 123.0
    other = write_golden(tmp_path / "g2", "w", "cpu", read_manifest(run), changed, _provenance())
    code, out = _gate(capsys, ["diff", golden, other])
    assert code == 1 and "training" in out
    (golden / "surfaces/training.json").write_bytes(b"{}")  # a damaged golden as RUN is unusable input
    code, err = _gate(capsys, ["diff", golden, other])
    assert code == 2 and "surfaces/training.json" in err


def test_an_oversized_tolerances_file_in_a_golden_is_refused_from_its_size(world, capsys, monkeypatch):
    from harness.spec import yaml_io

    _, run, golden, _ = world
    monkeypatch.setattr(yaml_io, "MAX_YAML_BYTES", 64)
    (golden / "tolerances.yaml").write_text("version: 1\nrules: []\n" + "#" * 100 + "\n")
    code, err = _gate(capsys, ["diff", run, golden])
    assert code == 2
    assert "tolerances.yaml" in err and "64-byte limit" in err
    code, out = _gate(capsys, ["lint", "--goldens-root", golden.parent.parent])  # lint parses the stored bytes
    assert code == 1
    assert "tolerances.yaml" in out and "64-byte limit" in out


@pytest.mark.parametrize("text", ["", "version: true\n", "rules: [\n"])
def test_write_golden_never_stores_a_tolerances_file_the_next_read_refuses(world, text):
    # before: refresh carried an unreadable tolerances.yaml into the new golden verbatim
    tmp_path, run, _, docs = world
    with pytest.raises(GoldenStoreError, match="tolerances.yaml"):
        write_golden(tmp_path / "fresh", "w", "cpu", read_manifest(run), docs, _provenance(), tolerances=text)
    assert not (tmp_path / "fresh/w/cpu").exists()


def test_a_run_that_says_complete_with_a_failed_check_gets_no_verdict(world, tmp_path, capsys):
    # before: status 'complete' with a failed postflight check -> PARITY (postflight never writes that pair)
    _, _, golden, docs = world
    checks = [{"name": "traces_intact", "outcome": "fail", "detail": "rank 3 trace truncated"}]
    run = make_run(tmp_path / "claims_complete", docs, checks=checks)
    code, err = _gate(capsys, ["diff", run, golden])
    assert code == 3
    assert "#/checks/0/outcome: 'fail' in a manifest whose status is 'complete'" in err
    assert "rank 3 trace truncated" in err
    with pytest.raises(GoldenStoreError, match="traces_intact"):
        write_golden(tmp_path / "fresh", "w", "cpu", read_manifest(run), docs, _provenance())


# --- wrong-typed manifest fields (found by fuzzing: each was a TypeError traceback, exit 3) ---

@pytest.mark.parametrize("side, change, pointer", [
    ("golden", lambda m: m["surfaces"][3].__setitem__("name", {"a": 1}), "/surfaces/3/name"),
    ("golden", lambda m: m["surfaces"][1].__setitem__("path", {"a": 1}), "/surfaces/1/path"),
    ("run", lambda m: m.__setitem__("artifacts", 5.5), "/artifacts"),
    ("run", lambda m: m.__setitem__("surfaces", 7), "/surfaces"),
])
def test_wrong_typed_manifest_fields_are_errors_not_tracebacks(world, capsys, side, change, pointer):
    tmp_path, run, golden, _ = world
    if side == "golden":
        _golden_manifest(golden, change)
    else:
        manifest = read_manifest(run)
        change(manifest)
        write_manifest(run, manifest)
    code, err = _gate(capsys, ["diff", run, golden])
    assert code == 2, err
    assert f"manifest.json#{pointer}" in err
    code, out = _gate(capsys, ["validate", golden if side == "golden" else run])
    assert code == 1
    assert f"manifest.json#{pointer}" in out
    code, _ = _gate(capsys, ["lint", "--goldens-root", tmp_path / "goldens"])
    assert code == 1


def _json_paths(doc, prefix=()):
    yield prefix
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield from _json_paths(value, prefix + (key,))


_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                       | st.text(max_size=6), lambda c: st.lists(c, max_size=3)
                       | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=5)


_FUZZ_TEMPLATE: dict[str, Path] = {}


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(which=st.sampled_from(["run/manifest.json", "run/run.json", "goldens/w/cpu/manifest.json",
                              "goldens/w/cpu/PROVENANCE.json"]), pick=st.integers(0, 10**6), value=_values)
def test_no_replaced_value_in_a_manifest_or_provenance_gives_a_traceback(tmp_path_factory, which, pick, value):
    """One value anywhere in the run's manifest / run.json or the golden's manifest /
    provenance replaced by arbitrary JSON: every command answers with an exit code, never a
    traceback."""
    import contextlib
    import io
    import shutil

    template = _FUZZ_TEMPLATE.get("dir")
    if template is None:  # one real run dir + golden, copied per example (write_golden fsyncs every file)
        template = _FUZZ_TEMPLATE["dir"] = tmp_path_factory.mktemp("fuzz_template")
        docs = synthetic_surfaces("w", seed=5)
        run = make_run(template / "run", docs)
        write_golden(template / "goldens", "w", "cpu", read_manifest(run), docs, _provenance())
    tmp_path = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(template, tmp_path, dirs_exist_ok=True)
    run = tmp_path / "run"
    target = tmp_path / which
    doc = json.loads(target.read_text())
    paths = list(_json_paths(doc))
    path = paths[pick % len(paths)]
    if not path:
        doc = value
    else:
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
    target.write_text(json.dumps(doc))
    golden = tmp_path / "goldens/w/cpu"
    for args in (["diff", run, golden], ["validate", golden], ["validate", run],
                 ["lint", "--goldens-root", tmp_path / "goldens"]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
        assert "Traceback" not in err.getvalue() + out.getvalue(), (which, path, value, args[0])
        assert code in (0, 1, 2, 3)


# --- a bad reader limit in the environment ---------------------------------------------------

@pytest.mark.parametrize("variable, value, says", [
    ("GOLDEN_YAML_MAX_BYTES", "abc", "$GOLDEN_YAML_MAX_BYTES='abc' is not an integer"),
    ("GOLDEN_YAML_MAX_NODES", "-5", "$GOLDEN_YAML_MAX_NODES must be >= 1, got -5"),
])
def test_a_bad_yaml_limit_in_the_environment_is_a_usage_error(variable, value, says):
    # before: int() at import time of harness.spec.yaml_io: a ValueError traceback, exit 3
    import os
    import subprocess
    import sys

    env = {**os.environ, variable: value, "GOLDEN_PROGRESS": "off"}
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "plan", "qwen3_moe_tiny_smoke"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert says in proc.stderr and "workload.yaml" in proc.stderr


def test_a_workload_folder_symlinked_out_of_the_goldens_root_is_refused(world, tmp_path, capsys):
    # before: golden diff RUN w --goldens-root R read R/w -> /elsewhere/w and gave PARITY; lint said nothing
    import shutil

    _, run, golden, _ = world
    elsewhere = tmp_path / "elsewhere" / "w"
    elsewhere.parent.mkdir()
    shutil.move(str(golden.parent), elsewhere)
    (tmp_path / "goldens" / "w").symlink_to(elsewhere, target_is_directory=True)
    code, err = _gate(capsys, ["diff", run, "w", "--goldens-root", tmp_path / "goldens", "--platform", "cpu"])
    assert code == 2
    assert f"{tmp_path / 'goldens' / 'w'}: is a symlink" in err
    code, out = _gate(capsys, ["lint", "--goldens-root", tmp_path / "goldens"])
    assert code == 1
    assert "damaged_golden" in out and "is a symlink" in out
    with pytest.raises(GoldenStoreError, match="is a symlink"):
        write_golden(tmp_path / "goldens", "w", "cuda", read_manifest(run), synthetic_surfaces("w", seed=5),
                     _provenance())
    assert not (elsewhere / "cuda").exists()


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_a_file_name_that_is_not_utf8_is_named_not_a_traceback(world, encoding):
    # before: print() of the '\udcff' file name raised UnicodeEncodeError: traceback, exit 3
    import os
    import subprocess
    import sys

    tmp_path, run, golden, _ = world
    with open(os.path.join(os.fsencode(golden / "surfaces"), b"\xff.json"), "wb") as handle:
        handle.write(b"{}")
    env = {**os.environ, "PYTHONIOENCODING": encoding, "GOLDEN_PROGRESS": "off"}
    repo = Path(__file__).resolve().parents[2]
    for args, expect in ((["validate", golden], 1), (["diff", run, golden], 2),
                         (["lint", "--goldens-root", tmp_path / "goldens"], 1)):
        proc = subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], env=env, cwd=repo,
                              capture_output=True, text=True, errors="replace", timeout=120)
        assert proc.returncode == expect, proc.stderr
        assert "Traceback" not in proc.stderr
        assert "surfaces/\\udcff.json" in proc.stdout + proc.stderr


def test_diff_refuses_a_platform_that_contradicts_the_golden_directory(world, capsys):
    # before: --platform was ignored for a golden directory: `--platform cuda goldens/w/cpu` compared cpu
    _, run, golden, _ = world
    code, err = _gate(capsys, ["diff", run, golden, "--platform", "cuda"])
    assert code == 2
    assert "--platform 'cuda' contradicts GOLDEN" in err and "'cpu'" in err
    assert _gate(capsys, ["diff", run, golden, "--platform", "cpu"])[0] == 0
