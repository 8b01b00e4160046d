"""Static HTML report (harness/parity/render/html.py): structure, escaping, self-containment, curves.

No browser here; ci/check_html_report.sh renders one in headless Chromium.
"""

from __future__ import annotations

import copy
import re
from html.parser import HTMLParser

import pytest

from harness.parity import compare
from harness.parity.render import FORMATS, render, render_html
from harness.parity.synthetic import Scale, synthetic_surfaces

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
HOSTILE = "<script>alert('x')</script>\"&'"
SCALE = Scale(policy_ranks=2, rollout_ranks=1, iterations=5, operators_per_phase=3, collectives_per_step=2,
              metrics=2, prompts=1, generations=1, layout=(("tp", 2), ("cp", 1), ("dp", 1), ("pp", 1)))


class Tree(HTMLParser):
    """Checks that tags balance; collects start tags with their attributes and all text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.tags, self.text = [], [], [], []
        self.doctype = None

    def handle_decl(self, decl):
        self.doctype = decl

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(text: str) -> Tree:
    tree = Tree()
    tree.feed(text)
    tree.close()
    assert tree.errors == [] and tree.stack == [], (tree.errors, tree.stack)
    return tree


def _with_curves(docs: dict) -> dict:
    for n, sid in enumerate(sorted(docs["training"]["sections"])):
        docs["training"]["sections"][sid]["metrics"].update(
            {"loss": 1.0 - 0.1 * n, "reward": 0.1 * n, "grad_norm": 2.0 / (n + 1)})
    return docs


@pytest.fixture
def golden():
    return _with_curves(synthetic_surfaces("w", scale=SCALE, seed=5))


@pytest.fixture
def failing(golden):
    actual = copy.deepcopy(golden)
    actual["training"]["sections"]["step0004"]["metrics"]["loss"] += 0.5
    actual["training"]["sections"]["step0002"]["metrics"]["reward"] *= 1 + 1e-6   # stale
    ops = actual["operators"]["sections"]["policy/rank00001"]["phases"]["train/step2"]["operators"]
    ops["aten::op_001"] += 2
    actual["memory"]["sections"]["policy/rank00000"]["phases"]["train/step1"]["peak_bytes"] *= 2   # info
    del actual["lifecycle"]["sections"]["rollout/rank00000"]
    return golden, actual, compare(golden, actual)


def test_dispatcher_knows_html(failing):
    golden, actual, verdict = failing
    assert "html" in FORMATS
    assert render(verdict, "html", title="t", surfaces_actual=actual, surfaces_golden=golden) == render_html(
        verdict, title="t", surfaces_actual=actual, surfaces_golden=golden)


def test_structure_balances_and_has_header_summary_and_findings(failing):
    golden, actual, verdict = failing
    assert verdict.status == "fail" and verdict.counts() == {"fail": 3, "stale": 1, "info": 1}
    text = render_html(verdict, title="demo", surfaces_actual=actual, surfaces_golden=golden)
    tree = parse(text)
    assert tree.doctype.lower() == "doctype html"
    (badge,) = [a for t, a in tree.tags if a.get("id") == "verdict-status"]
    assert badge["data-status"] == "fail"
    summary_rows = [a for t, a in tree.tags if t == "tr" and "surface" in a.get("class", "").split()]
    assert len(summary_rows) == len(verdict.surfaces)
    finding_rows = [
        a["class"].split()[1] for t, a in tree.tags if t == "tr" and a.get("class", "").startswith("finding")
    ]
    assert sorted(finding_rows) == sorted(f.status for f in verdict.findings)
    # one findings table per surface with findings, anchored from the summary
    anchors = {a["href"] for t, a in tree.tags if t == "a"}
    ids = {a["id"] for t, a in tree.tags if "id" in a}
    assert {h[1:] for h in anchors} <= ids
    tables = [1 for t, a in tree.tags if t == "table" and a.get("class") == "findings"]
    assert len(tables) == len([s for s in verdict.surfaces.values() if s.findings]) == 4
    body = "".join(tree.text)
    for word in ("FAIL", "STALE?", "info", "/operators/aten::op_001", "cp=0,dp=0,pp=0,tp=1", "train/step2"):
        assert word in body
    assert "probable stale golden" in body


def test_hostile_values_are_escaped(golden):
    actual = copy.deepcopy(golden)
    actual["operators"]["sections"]["policy/rank00000"]["phases"]["train/step1"]["operators"][HOSTILE] = 1
    actual["rollouts"]["sections"]["s01-p000-g00"]["decision"] = HOSTILE
    actual["rollouts"]["sections"]["s01-p000-g00"]["calls"][0]["chain_digest"] = HOSTILE * 10   # long -> <details>
    actual["training"]["sections"]["step0001"]["metrics"][HOSTILE] = 1.0
    verdict = compare(golden, actual)
    text = render_html(verdict, title=HOSTILE, surfaces_actual=actual, surfaces_golden=golden,
                       metrics=("loss", HOSTILE))
    tree = parse(text)
    assert "<script" not in text.lower()
    assert "script" not in {t for t, _ in tree.tags}
    assert HOSTILE not in text
    assert "&lt;script&gt;" in text
    body = "".join(tree.text)   # entities decoded: the hostile text is shown as text
    assert "<script>alert('x')</script>" in body
    assert body.count("<script>alert") >= 4   # title, key, decision value, chain digest, curve caption


def test_self_contained_no_external_references(failing):
    golden, actual, verdict = failing
    text = render_html(verdict, surfaces_actual=actual, surfaces_golden=golden)
    assert "http://" not in text and "https://" not in text
    assert "xmlns" not in text
    tree = parse(text)
    assert not [t for t, _ in tree.tags if t in ("script", "link", "img", "iframe", "object")]
    assert all(a["href"].startswith("#") for t, a in tree.tags if t == "a")
    csp = [a for t, a in tree.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]["content"]


def _points(attrs: dict) -> list[tuple[float, float]]:
    return [tuple(map(float, p.split(","))) for p in attrs["points"].split()]


def test_svg_one_polyline_per_series_with_a_point_per_step(failing):
    golden, actual, verdict = failing
    tree = parse(render_html(verdict, surfaces_actual=actual, surfaces_golden=golden))
    svgs = [a["data-metric"] for t, a in tree.tags if t == "svg"]
    assert svgs == ["loss", "reward", "grad_norm"]
    polylines = [a for t, a in tree.tags if t == "polyline"]
    assert [a["class"] for a in polylines] == ["actual", "golden"] * 3
    for a in polylines:
        pts = _points(a)
        assert len(pts) == 5 == int(a["data-points"])
        xs = [x for x, _ in pts]
        assert xs == sorted(xs) and len(set(xs)) == 5   # one point per step, in step order
    # the loss finding at step 4 and the stale reward at step 2 are ringed
    rings = [a["class"] for t, a in tree.tags if t == "circle" and "differs" in a.get("class", "")]
    assert "differs fail" in rings and "differs stale" in rings


def test_svg_geometry_follows_the_values(golden):
    actual = copy.deepcopy(golden)
    verdict = compare(golden, actual)
    tree = parse(render_html(verdict, surfaces_actual=actual, surfaces_golden=None))
    (loss,) = [a for t, a in tree.tags if t == "polyline" and a.get("class") == "actual"][:1]
    ys = [y for _, y in _points(loss)]
    # loss falls 1.0 -> 0.6 each step: SVG y grows downwards, strictly (a flat line is no curve)
    assert ys == sorted(set(ys)), ys
    assert not [a for t, a in tree.tags if t == "polyline" and a.get("class") == "golden"]


def test_only_golden_and_missing_metric(golden):
    verdict = compare(golden, copy.deepcopy(golden))
    text = render_html(verdict, surfaces_golden=golden, metrics=("loss", "no_such_metric"))
    tree = parse(text)
    assert [a["class"] for t, a in tree.tags if t == "polyline"] == ["golden"]
    assert "no numeric no_such_metric metric" in "".join(tree.text)


def test_metric_under_a_prefix_is_found(golden):
    for body in golden["training"]["sections"].values():
        body["metrics"]["train/grad_norm"] = body["metrics"].pop("grad_norm")
    tree = parse(render_html(compare(golden, golden), surfaces_actual=golden))
    assert [a["data-metric"] for t, a in tree.tags if t == "svg"] == ["loss", "reward", "train/grad_norm"]


def test_parity_verdict_has_no_findings_table(golden):
    actual = copy.deepcopy(golden)
    verdict = compare(golden, actual)
    assert verdict.status == "parity"
    text = render_html(verdict, title="ok", surfaces_actual=actual, surfaces_golden=golden)
    tree = parse(text)
    assert not [1 for t, a in tree.tags if t == "table" and a.get("class") == "findings"]
    assert not [1 for t, a in tree.tags if t == "tr" and a.get("class", "").startswith("finding")]
    (badge,) = [a for t, a in tree.tags if a.get("id") == "verdict-status"]
    assert badge["data-status"] == "parity"
    assert "No findings" in "".join(tree.text)


def test_no_surfaces_no_curves_and_deterministic_output(failing):
    _, _, verdict = failing
    text = render_html(verdict, title="t")
    parse(text)
    assert "<svg" not in text and 'id="curves"' not in text
    assert text == render_html(verdict, title="t")


def test_limit_caps_rows_and_says_how_many_more(golden):
    actual = copy.deepcopy(golden)
    for body in actual["training"]["sections"].values():
        body["metrics"]["loss"] += 1.0
    verdict = compare(golden, actual)
    text = render_html(verdict, limit=2)
    parse(text)
    assert text.count('<tr class="finding fail">') == 2
    assert re.search(r"and 3 more", text)


def test_nan_and_non_numeric_metric_values_are_skipped(golden):
    docs = copy.deepcopy(golden)
    docs["training"]["sections"]["step0002"]["metrics"]["loss"] = float("nan")
    docs["training"]["sections"]["step0003"]["metrics"]["loss"] = "n/a"
    docs["training"]["sections"]["step0004"]["metrics"]["loss"] = True
    tree = parse(render_html(compare(golden, golden), surfaces_actual=docs, metrics=("loss",)))
    (line,) = [a for t, a in tree.tags if t == "polyline"]
    assert int(line["data-points"]) == len(_points(line)) == 2


def test_golden_diff_format_html_plots_both_sides(tmp_path, golden):
    import json

    from harness.cli import main
    from harness.manifest import surface_entry
    from harness.parity.synthetic import synthetic_manifest
    from harness.store import new_provenance, write_golden
    from harness.surfaces import surface_file_bytes

    def make_run(run, docs):
        (run / "surfaces").mkdir(parents=True)
        for name, doc in docs.items():
            (run / "surfaces" / f"{name}.json").write_bytes(surface_file_bytes(doc))
        manifest = synthetic_manifest("w", SCALE)
        manifest["surfaces"] = [surface_entry(run, name) for name in sorted(docs)]
        (run / "manifest.json").write_text(json.dumps(manifest))
        return run

    stored = write_golden(
        tmp_path / "goldens",
        "w",
        "cpu",
        json.loads((make_run(tmp_path / "g", golden) / "manifest.json").read_text()),
        golden,
        new_provenance(commit=None, reason="t", command="pytest", environment={}),
    )
    actual = copy.deepcopy(golden)
    actual["training"]["sections"]["step0003"]["metrics"]["grad_norm"] += 1.0
    out = tmp_path / "report.html"
    assert (
        main(["diff", str(make_run(tmp_path / "run", actual)), str(stored), "--format", "html", "--output", str(out)])
        == 1
    )
    tree = parse(out.read_text())
    assert [a["class"] for t, a in tree.tags if t == "polyline"] == ["actual", "golden"] * 3
    assert "/metrics/grad_norm" in "".join(tree.text)


def test_gated_findings_first_informational_collapsed_causes_and_maps(failing):
    _, _, verdict = failing
    text = render_html(verdict, title="t")
    tree = parse(text)
    # causes before maps before findings; the informational memory table sits in a closed <details> after them
    assert text.index('id="causes"') < text.index('id="maps"') < text.index('id="findings"')
    (info,) = [a for t, a in tree.tags if t == "details" and a.get("id") == "informational"]
    assert "open" not in info and text.index('id="informational"') < text.index('id="surface-memory"')
    assert all(text.index('id="surface-memory"') > text.index(f'id="surface-{n}"')
               for n in ("lifecycle", "operators", "training"))
    causes = [a for t, a in tree.tags if t == "li" and "cause" in a.get("class", "").split()]
    assert [c["data-surface"] for c in causes] == [d.cause.surface for d in verdict.divergences]
    # one map per surface with findings; each coloured cell links to an existing finding row
    maps = [a["data-surface"] for t, a in tree.tags if t == "table" and a.get("class") == "rankmap"]
    assert maps == ["lifecycle", "operators", "training", "memory"]
    cells = [a for t, a in tree.tags if t == "td" and "data-step" in a]
    assert {c["class"].split()[0] for c in cells} == {"fail", "stale", "info"}
    ops = [c for c in cells if c["data-row"] == "policy/rank00001"]
    assert [c["data-step"] for c in ops] == ["2"]
    ids = {a["id"] for t, a in tree.tags if "id" in a}
    assert {a["href"][1:] for t, a in tree.tags if t == "a"} <= ids


def test_provenance_block_shows_every_field_it_is_given(failing):
    _, _, verdict = failing
    prov = {"commit": "bf8f1ca", "date": "2026-11-29T10:44:46+00:00", "reason": "1F1B " + HOSTILE,
            "command": "golden refresh w", "consumer_repo_commit": "c0ffee", "versions": {"torch": "2.13.0"}}
    text = render_html(verdict, title="t", provenance=prov, run={"run_id": "w-1234abcd"})
    tree = parse(text)
    # the golden's described provenance (repository, date, reason, versions), then every other
    # recorded field and the run's id, near the top of the page
    assert text.index('<section id="provenance">') < text.index('id="run-provenance"') < text.index('id="summary"')
    fields = [a["data-field"] for t, a in tree.tags if t == "dd"]
    assert fields == ["commit", "command", "consumer_repo_commit", "run_id"]
    body = "".join(tree.text)
    assert "w-1234abcd" in body and "c0ffee" in body and "2.13.0" in body and "2026-11-29T10:44:46" in body
    assert HOSTILE not in text and "&lt;script&gt;" in text
    plain = render_html(verdict, title="t")
    assert 'id="provenance"' not in plain and 'id="run-provenance"' not in plain
