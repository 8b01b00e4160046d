"""The numerics surface in the gate: the first diverging module leads, an older golden without
the surface is still checked and says so, and the schema and store accept what runs record.

Documents here are hand-built in the shape the probe writes (docs/locator.md); the real
runs' surfaces are checked by the golden tests and benches/locator_plants.py."""

from __future__ import annotations

import copy

from harness.parity.comparison import compare
from harness.parity.locate import entry_order
from harness.surfaces.registry import GATED_SURFACES, OPTIONAL_SURFACES, validate_surface

SHA = "0" * 64


def _sha(n: int) -> str:
    return f"{n:064x}"


def _rank(pp: int, entries: dict[str, dict]) -> dict:
    return {"coords": {"tp": 0, "pp": pp, "cp": 0, "ep": 0, "dp": 0}, "backend": "native", "depth": "modules",
            "recorded": True, "entries": entries}


def _e(seq: int, n: int, inputs: list[str] | None = None) -> dict:
    rec = {"seq": seq, "sha256": _sha(n), "shape": [2, 4], "dtype": "float32"}
    if inputs is not None:
        rec["inputs"] = inputs
    return rec


def _doc() -> dict:
    # two pipeline stages: rank 0 holds layer 0, rank 1 layer 1; alphabetical order of the
    # module names ("mlp" < "self_attn") is not execution order
    s0 = {
        "step0000/param/mb000/model.layers.0.mlp.experts.1.up_proj.weight#0": _e(0, 1),
        "step0001/forward/mb000/model.layers.0.self_attn.q_proj#0": _e(0, 2, []),
        "step0001/forward/mb000/model.layers.0.self_attn.attention#0": _e(1, 3, ["model.layers.0.self_attn.q_proj"]),
        "step0001/forward/mb000/model.layers.0.mlp.gate#0": _e(2, 4, []),
        "step0001/backward/mb000/model.layers.0.mlp.gate#0": _e(3, 5),
        "step0001/backward/mb000/model.layers.0.self_attn.attention#0": _e(4, 6),
        "step0001/backward/mb000/model.layers.0.self_attn.q_proj#0": _e(5, 7),
        "step0001/param/mb000/model.layers.0.mlp.experts.1.up_proj.weight#0": _e(6, 8),
    }
    s1 = {
        "step0001/forward/mb000/model.layers.1.self_attn.q_proj#0": _e(0, 12, []),
        "step0001/forward/mb000/model.layers.1.mlp.gate#0": _e(1, 13, []),
        "step0001/backward/mb000/model.layers.1.mlp.gate#0": _e(2, 14),
    }
    return {"surface": "numerics", "version": 1, "workload": "w",
            "sections": {"policy/rank00000": _rank(0, s0), "policy/rank00001": _rank(1, s1)}}


def _bump(doc: dict, section: str, key: str) -> None:
    doc["sections"][section]["entries"][key]["sha256"] = _sha(999 + len(key))


def _training(loss: float) -> dict:
    return {"surface": "training", "version": 1, "workload": "w",
            "sections": {"step0001": {"step": 1, "metrics": {"loss": loss}}}}


def test_schema_accepts_a_recorded_and_a_not_recorded_rank():
    doc = _doc()
    assert validate_surface(doc) == []
    doc["sections"]["policy/rank00002"] = {"coords": {}, "backend": "megatron", "recorded": False,
                                           "reason": "no taps", "entries": {}}
    assert validate_surface(doc) == []
    doc["sections"]["policy/rank00002"]["reason"] = ""
    assert validate_surface(doc), "a reason is never empty"
    bad = _doc()
    bad["sections"]["policy/rank00000"]["entries"]["step0001/forward/mb000/model.layers.0.mlp.gate#0"]["sha256"] = "n:1"
    assert validate_surface(bad), "a digest is a sha256, never a norm"


def test_numerics_is_gated_but_optional():
    assert "numerics" in OPTIONAL_SURFACES and "numerics" not in GATED_SURFACES


def test_the_first_module_in_execution_order_leads_and_the_rest_follow():
    golden, actual = _doc(), _doc()
    # layer 0's self_attn.attention (seq 1) and everything downstream of it differ; rank 1's
    # forward too; its mlp.gate sorts first by name but runs later
    for key in ("step0001/forward/mb000/model.layers.0.self_attn.attention#0",
                "step0001/forward/mb000/model.layers.0.mlp.gate#0",
                "step0001/backward/mb000/model.layers.0.mlp.gate#0"):
        _bump(actual, "policy/rank00000", key)
    _bump(actual, "policy/rank00001", "step0001/forward/mb000/model.layers.1.self_attn.q_proj#0")
    verdict = compare({"numerics": golden, "training": _training(1.0)},
                      {"numerics": actual, "training": _training(1.5)})
    assert verdict.status == "fail"
    first = verdict.divergences[0]
    assert first.cause.surface == "numerics" and first.cause.section == "policy/rank00000"
    assert first.cause.key.startswith("/model.layers.0.self_attn.attention#0")
    assert first.cause.phase == "step0001/forward/mb000"
    note = first.cause.note
    assert "first diverging module: model.layers.0.self_attn.attention (forward output)" in note
    assert "(model.layers.0.self_attn.q_proj) match" in note and "digest-only" in note
    assert "pp=0" in note and "step 1, microbatch 0" in note
    rules = {(rule, f.surface) for rule, f in first.consequences}
    assert rules == {("downstream in the model", "numerics"), ("follows the data", "training")}
    assert len(verdict.divergences) == 1
    # the cause in the surface's own findings is the annotated one (reports mark it)
    assert any(f is first.cause for f in verdict.surfaces["numerics"].findings)


def test_initial_weights_come_first():
    golden, actual = _doc(), _doc()
    _bump(actual, "policy/rank00000", "step0000/param/mb000/model.layers.0.mlp.experts.1.up_proj.weight#0")
    _bump(actual, "policy/rank00000", "step0001/forward/mb000/model.layers.0.mlp.gate#0")
    d = compare({"numerics": golden}, {"numerics": actual}).divergences[0]
    assert "first diverging parameter: model.layers.0.mlp.experts.1.up_proj.weight as initialised" in d.cause.note


def test_a_backward_divergence_names_the_consumer():
    golden, actual = _doc(), _doc()
    _bump(actual, "policy/rank00000", "step0001/backward/mb000/model.layers.0.self_attn.q_proj#0")
    d = compare({"numerics": golden}, {"numerics": actual}).divergences[0]
    assert "at the output of model.layers.0.self_attn.q_proj" in d.cause.note
    assert "in the backward of model.layers.0.self_attn.attention" in d.cause.note


def test_pipeline_order_forward_ascending_backward_descending():
    doc = _doc()
    fwd0 = entry_order("policy/rank00000", "step0001/forward/mb000/model.layers.0.mlp.gate#0", doc, doc)
    fwd1 = entry_order("policy/rank00001", "step0001/forward/mb000/model.layers.1.self_attn.q_proj#0", doc, doc)
    bwd0 = entry_order("policy/rank00000", "step0001/backward/mb000/model.layers.0.mlp.gate#0", doc, doc)
    bwd1 = entry_order("policy/rank00001", "step0001/backward/mb000/model.layers.1.mlp.gate#0", doc, doc)
    assert fwd0 < fwd1 < bwd1 < bwd0


def test_a_golden_without_the_surface_is_checked_on_the_rest_and_says_so():
    actual = {"numerics": _doc(), "training": _training(1.0)}
    same = compare({"training": _training(1.0)}, actual)
    assert same.status == "parity"
    [finding] = same.surfaces["numerics"].findings
    assert finding.status == "info" and "not in this golden (refresh to gate it)" in finding.note
    changed = compare({"training": _training(1.0)}, {**actual, "training": _training(2.0)})
    assert changed.status == "fail"   # every other surface still gates


def test_a_run_without_the_surface_fails_a_golden_that_has_it():
    verdict = compare({"numerics": _doc()}, {})
    assert verdict.status == "fail"


def test_equal_not_recorded_sections_pass_but_stay_visible_in_the_document():
    doc = _doc()
    doc["sections"] = {"policy/rank00000": {"coords": {}, "backend": "megatron", "recorded": False,
                                            "reason": "policy backend megatron has no numerics taps",
                                            "entries": {}}}
    assert compare({"numerics": doc}, {"numerics": copy.deepcopy(doc)}).status == "parity"
    recorded = _doc()
    assert compare({"numerics": doc}, {"numerics": recorded}).status == "fail"


def test_an_earlier_cause_keeps_the_lead_and_the_module_follows_from_it():
    # a changed rollout of step 1 (stage 0) precedes the training step that consumes it: the
    # first diverging module of step 1 is its consequence, not a cause of its own
    golden, actual = _doc(), _doc()
    _bump(actual, "policy/rank00000", "step0001/forward/mb000/model.layers.0.self_attn.q_proj#0")
    _bump(actual, "policy/rank00000", "step0001/forward/mb000/model.layers.0.mlp.gate#0")
    rollout = {"surface": "rollouts", "version": 1, "workload": "w",
               "sections": {"step0001-attempt1-row0000": {"tokens_digest": "a"}}}
    changed = copy.deepcopy(rollout)
    changed["sections"]["step0001-attempt1-row0000"]["tokens_digest"] = "b"
    verdict = compare({"numerics": golden, "rollouts": rollout}, {"numerics": actual, "rollouts": changed})
    assert len(verdict.divergences) == 1
    d = verdict.divergences[0]
    assert d.cause.surface == "rollouts"
    surfaces = sorted((rule, f.surface) for rule, f in d.consequences)
    assert surfaces == [("follows the data", "numerics"), ("follows the data", "numerics")]
