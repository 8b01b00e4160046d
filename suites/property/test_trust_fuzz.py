"""Fuzzing the trust boundary of a golden (issue 41): generated goldens and runs through `golden diff`.

Each example stores a golden (``write_golden``, with generated tolerances, waivers and
platform), may tamper with it by hand (a tolerances.yaml dropped in, an unlisted file, two
surface entries swapped, a surface replaced with its manifest sha256 fixed), builds a run from
generated changes (drifted metrics and counts, integers outside 64 bits, long strings, NFD
look-alike keys) and runs the real command in-process in one of the five report formats. What
must hold, whatever was generated:

* no traceback, no internal error: the exit code is 0, 1 or 2;
* a tampered golden or a run holding a number outside the domain is refused (exit 2);
* no wrong PARITY: exit 0 only when the run's gated surfaces equal the golden's, or the
  golden's tolerances were accepted by the store and the report names the rule that
  passed each difference;
* bounded output: the report stays under 1 MB whatever the documents hold.

``HYPOTHESIS_PROFILE=ci`` (the default) runs 60 examples (a few seconds);
``GOLDEN_FUZZ_EXAMPLES=N`` runs N (the figures of a 10k run are in docs/gate.md).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.parity.synthetic import synthetic_surfaces
from harness.store import new_provenance, write_golden
from harness.store.atomic import GoldenStoreError
from harness.surfaces import surface_file_bytes
from harness.surfaces.digest import sha256_hex
from harness.surfaces.registry import GATED_SURFACES, normalise
from suites.run_dirs import make_run, read_manifest

_N = int(os.environ.get("GOLDEN_FUZZ_EXAMPLES", "0") or 0)
FUZZ = settings(max_examples=_N or max(60, settings().max_examples), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BASES = {seed: synthetic_surfaces("w", seed=seed) for seed in range(3)}
STATS = {"examples": 0, "exit": {}, "max_report": 0, "passed_by_rules": 0, "refused_by_policy": 0, "max_s": 0.0}

rules = st.fixed_dictionaries({
    "surface": st.sampled_from(["training", "operators", "rollouts", "memory", "collectives"]),
    "key": st.sampled_from(["*", "metrics.loss", "metrics.*", "phases.*"]),
    "abs": st.sampled_from([0.0, 1e-4, 0.01, 1.0, 1e300]),
    "rel": st.sampled_from([0.0, 1e-4, 0.03, 0.06, 1.0, 1e300]),
    "when": st.sampled_from(["always", "nondeterministic"]),
    "reason": st.just("generated"),
})
tolerances = st.none() | st.fixed_dictionaries({
    "version": st.just(1),
    "rules": st.lists(rules, max_size=3),
}, optional={"deterministic": st.booleans()})
mutation = st.one_of(
    st.tuples(st.just("scale_metric"), st.sampled_from([1e-12, 1e-3, 0.02, 0.5, 4.0])),
    st.tuples(st.just("bump_count"), st.integers(1, 200)),
    st.tuples(st.just("huge_int"), st.sampled_from([2 ** 63, -(2 ** 63) - 1, 10 ** 400])),
    st.tuples(st.just("long_string"), st.integers(3000, 300_000)),
    st.tuples(st.just("nfd_key"), st.just(0)),
)
tamper = st.sampled_from(["none", "none", "drop_in_tolerances", "unlisted_file", "swap_entries", "consistent_edit"])


def _mutate(docs: dict, kind: str, arg) -> bool:
    """Apply one change to the run's documents; True when it leaves the gate's domain."""
    if kind == "scale_metric":
        for section in docs["training"]["sections"].values():
            section["metrics"]["loss"] *= 1 + arg
    elif kind == "bump_count":
        section = next(iter(docs["operators"]["sections"].values()))
        counts = next(iter(section["phases"].values()))["operators"]
        counts[next(iter(counts))] += arg
    elif kind == "huge_int":
        section = next(iter(docs["memory"]["sections"].values()))
        phase = next(iter(section["phases"].values()))
        phase[next(iter(phase))] = arg
        return True
    elif kind == "long_string":
        next(iter(docs["rollouts"]["sections"].values()))["sample_digest"] = "z" * arg
    elif kind == "nfd_key":
        section = next(iter(docs["operators"]["sections"].values()))
        next(iter(section["phases"].values()))["operators"]["aten::cafe\u0301"] = 1
    return False


def _yaml(doc: dict) -> str:
    return json.dumps(doc)  # JSON is YAML; floats like 1e300 keep their exponent


@FUZZ
@given(seed=st.sampled_from(sorted(BASES)), tol=tolerances, waive=st.sampled_from(["none", "all", "first"]),
       platform=st.sampled_from(["cpu", "cuda"]), changes=st.lists(mutation, max_size=3), tampering=tamper,
       fmt=st.sampled_from(["terminal", "markdown", "json", "junit", "html"]))
def test_generated_goldens_and_runs_never_give_a_wrong_parity(seed, tol, waive, platform, changes, tampering, fmt):
    tmp = Path(tempfile.mkdtemp(prefix="trust-fuzz-"))
    start = time.perf_counter()
    try:
        _one(tmp, seed, tol, waive, platform, changes, tampering, fmt)
    finally:
        STATS["max_s"] = max(STATS["max_s"], time.perf_counter() - start)
        shutil.rmtree(tmp, ignore_errors=True)


def _one(tmp: Path, seed, tol, waive, platform, changes, tampering, fmt) -> None:
    docs = BASES[seed]
    run_docs = copy.deepcopy(docs)
    outside = False
    for kind, arg in changes:
        outside |= _mutate(run_docs, kind, arg)
    waivers = {}
    if tol is not None:
        count = len(tol["rules"]) if waive == "all" else (1 if waive == "first" else 0)
        waivers = {f"rules[{i}]": {"reason": "fuzz", "evidence": {"runs": 3}} for i in range(count)}
        if waive == "all":
            waivers["deterministic"] = {"reason": "fuzz", "evidence": {"runs": 3}}
    capture = make_run(tmp / "capture", docs)
    text = _yaml(tol) if tol is not None else None
    accepted = False
    try:
        golden = write_golden(tmp / "goldens", "w", platform, read_manifest(capture), docs,
                              new_provenance(commit=None, reason="fuzz", command="pytest", environment={},
                                             tolerance_evidence={"waivers": waivers} if waivers else None),
                              tolerances=text)
        accepted = text is not None
    except GoldenStoreError as exc:  # the policy refused the tolerances: stored without them
        assert "tolerances.yaml" in str(exc) and "nothing was stored" in str(exc), str(exc)
        STATS["refused_by_policy"] += 1
        golden = write_golden(tmp / "goldens", "w", platform, read_manifest(capture), docs,
                              new_provenance(commit=None, reason="fuzz", command="pytest", environment={}))
    tampered = tampering != "none"
    if tampering == "drop_in_tolerances":
        # by hand: never the bytes the store recorded (a comment line makes them differ)
        (golden / "tolerances.yaml").write_text(_yaml(tol or {"version": 1, "deterministic": False}) + "\n# by hand\n")
        accepted = False
    elif tampering == "unlisted_file":
        (golden / "surfaces" / "extra.json").write_bytes(surface_file_bytes(docs["training"]))
    elif tampering == "swap_entries":
        manifest = json.loads((golden / "manifest.json").read_text())
        by_name = {e["name"]: e for e in manifest["surfaces"]}
        a, b = by_name["training"], by_name["operators"]
        a["path"], b["path"], a["sha256"], b["sha256"] = b["path"], a["path"], b["sha256"], a["sha256"]
        (golden / "manifest.json").write_bytes(surface_file_bytes(manifest))
    elif tampering == "consistent_edit":
        # by hand, and consistent: the golden now holds the run's training surface and the manifest
        # records its sha256, so only the goldens lock (GOLDENS.lock) shows the edit
        data = surface_file_bytes(run_docs["training"])
        tampered = data != (golden / "surfaces" / "training.json").read_bytes()  # else the edit changes nothing
        (golden / "surfaces" / "training.json").write_bytes(data)
        manifest = json.loads((golden / "manifest.json").read_text())
        for entry in manifest["surfaces"]:
            if entry["name"] == "training":
                entry["sha256"] = sha256_hex(data)
        (golden / "manifest.json").write_bytes(surface_file_bytes(manifest))
    run = make_run(tmp / "run", run_docs)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["diff", str(run), str(golden), "--format", fmt])
    report, errors = out.getvalue(), err.getvalue()
    STATS["examples"] += 1
    STATS["exit"][rc] = STATS["exit"].get(rc, 0) + 1
    STATS["max_report"] = max(STATS["max_report"], len(report) + len(errors))
    assert rc in (0, 1, 2), (rc, errors[-2000:])
    assert "Traceback" not in errors, errors[-2000:]
    assert len(report) + len(errors) < 1_000_000, len(report)
    if tampered or outside:
        assert rc == 2, (tampering, changes, rc, report[:2000])
        return
    if rc == 0:
        equal = all(normalise(run_docs[n]) == normalise(docs[n]) for n in GATED_SURFACES)
        if not equal:  # a difference passed: only through accepted tolerances, and the report names them
            assert accepted, (tol, changes)  # the store accepted the tolerances (or the lanes' defaults did)
            if fmt == "json":
                assert json.loads(report)["rules_applied"], report[:3000]
            else:
                assert "rules that changed the verdict" in report.lower(), report[:3000]
            STATS["passed_by_rules"] += 1


def test_zz_fuzz_figures():
    """Prints what the fuzz test above ran (examples, exit codes, largest report, peak RSS)."""
    with open("/proc/self/status") as status:
        hwm = next((line.split()[1] for line in status if line.startswith("VmHWM")), "?")
    print(f"trust fuzz: {STATS['examples']} examples, exits {dict(sorted(STATS['exit'].items()))}, "
          f"{STATS['passed_by_rules']} parity through named accepted rules, {STATS['refused_by_policy']} "
          f"tolerances refused by the store, largest report {STATS['max_report']} chars, slowest example "
          f"{STATS['max_s']:.2f} s (store, tamper, run dir, diff), peak RSS {hwm} kB")
