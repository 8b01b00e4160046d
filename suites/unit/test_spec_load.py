"""Spec loading: goldens load, defaults fill, malformed specs name their field,
overrides are YAML-typed, the digest is canonical."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from harness.spec import SpecError, TopologyError, apply_overrides, list_workloads, load_spec, schema, spec_digest
from harness.spec.load import default_goldens_root

REPO = Path(__file__).resolve().parents[2]
GOLDENS = REPO / "goldens"
INVALID = REPO / "fixtures" / "specs_invalid"
EXPECTED_WORKLOADS = {
    "nemo_rl_qwen3_235b",
    "qwen3_moe_tiny_tp2pp2cp2ep2",
    "qwen3_moe_tiny_smoke",
    "qwen3_moe_tiny_dataplane",
    "qwen3_moe_tiny_streaming",
    "qwen3_moe_tiny_distill",
    "qwen3_moe_tiny_multiturn",
}
MODEL = {"layers": 4, "hidden": 64, "heads": 8, "kv_heads": 2, "head_dim": 16, "experts": 8,
         "top_k": 2, "moe_intermediate": 32, "vocab": 256}


def _write(tmp_path: Path, doc: dict | str, name: str = "w.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))  # JSON is YAML
    return path


def _expected_field(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), f"{path.name} must start with '# expect: <field>'"
    return first.split(":", 1)[1].strip()


def test_schema_is_valid_draft_2020_12_and_its_defaults_validate():
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(schema.load_schema())
    filled = schema.fill_defaults({"name": "x", "model": dict(MODEL)})
    schema.validate(filled)  # every default is itself valid
    # every top-level block but the optional distill: and numerics: blocks (absent = no distillation,
    # numerics at its default depth; docs/spec.md, docs/locator.md)
    assert set(filled) == set(schema.load_schema()["properties"]) - {"distill", "numerics"}


def test_every_golden_workload_loads_and_is_complete():
    assert set(list_workloads(GOLDENS)) >= EXPECTED_WORKLOADS
    leaves = schema.defaults_tree()
    for name in EXPECTED_WORKLOADS:
        spec = load_spec(name, goldens_root=GOLDENS)
        assert spec["name"] == name
        for dotted in leaves:  # every defaulted leaf is present: code may index without .get
            node = spec
            for part in dotted.split("."):
                node = node[part]


def test_cpu_workloads_are_small_and_scheduled_on_cpu():
    for name in EXPECTED_WORKLOADS - {"nemo_rl_qwen3_235b"}:
        spec = load_spec(name, goldens_root=GOLDENS)
        assert spec["platform"]["platforms"][0] == "cpu" and spec["platform"]["device"] == "cpu", name
        # single-turn fits 64 tokens; the 3-turn tool episodes need more room
        max_seq = 160 if spec["env"]["turns"] > 1 else 64
        assert spec["model"]["vocab"] == 256 and spec["policy"]["seq_len"] <= max_seq, name
        assert spec["grpo"]["prompts_per_step"] == 4 and spec["grpo"]["generations_per_prompt"] == 4, name
        assert spec["plugins"]["policy_profiler"] and spec["plugins"]["rollout_profiler"], name


def test_235b_workload_is_planned_only():
    spec = load_spec("nemo_rl_qwen3_235b", goldens_root=GOLDENS)
    assert spec["platform"]["platforms"] == []
    assert "planned only" in spec["description"].lower()
    p = spec["policy"]
    assert (p["tp"], p["pp"], p["cp"], p["ep"], p["etp"], p["dp"]) == (2, 4, 2, 16, 1, 4)


def test_defaults_are_filled(tmp_path):
    spec = load_spec(_write(tmp_path, {"name": "mini", "model": MODEL}))
    assert spec["policy"]["tp"] == 1 and spec["policy"]["pp_layout"] is None
    assert spec["rollout"]["refit"] == {"transport": "auto", "buffer_size_bytes": 65536}
    assert spec["grpo"]["loss"]["kl_type"] == "k3"
    assert spec["model"]["rope_theta"] == 1e6 and isinstance(spec["model"]["rope_theta"], float)
    assert spec["plugins"] == {"policy_profiler": None, "rollout_profiler": None}
    assert spec["platform"]["platforms"] == []


@pytest.mark.parametrize("path", sorted(INVALID.glob("*.yaml")), ids=lambda p: p.stem)
def test_invalid_fixture_is_rejected_naming_its_field(path):
    expected = _expected_field(path)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.field == expected
    assert expected in str(info.value)
    assert path.name in str(info.value)  # the file is named too


def test_there_are_at_least_ten_invalid_fixtures():
    assert len(list(INVALID.glob("*.yaml"))) >= 10


def test_topology_fixtures_carry_their_rule():
    for path in sorted(INVALID.glob("*.yaml")):
        lines = path.read_text().splitlines()
        if len(lines) > 1 and lines[1].startswith("# rule:"):
            with pytest.raises(TopologyError) as info:
                load_spec(path)
            assert info.value.rule == lines[1].split(":", 1)[1].strip(), path.name


def test_overrides_are_yaml_typed_and_do_not_mutate():
    base = {"name": "x", "model": dict(MODEL), "plugins": {"policy_profiler": "a.B"}}
    before = copy.deepcopy(base)
    out = apply_overrides(base, [
        "policy.tp=4", "plugins.policy_profiler=null", "policy.pp_layout=[1, 3]",
        "policy.sp=true", "policy.optimizer.lr=1e-3", "description=hello world", "seed=7", "seed=8",
    ])
    assert base == before
    assert out["policy"]["tp"] == 4 and out["policy"]["sp"] is True
    assert out["plugins"]["policy_profiler"] is None
    assert out["policy"]["pp_layout"] == [1, 3]
    lr = out["policy"]["optimizer"]["lr"]
    assert lr == pytest.approx(1e-3) and isinstance(lr, float)
    assert out["description"] == "hello world"
    assert out["seed"] == 8  # later wins


@pytest.mark.parametrize("text, field", [
    ("policy.tp", "overrides"),
    ("=3", "overrides"),
    ("policy..tp=3", "policy..tp"),
    ("policy.tp=[1", "policy.tp"),
    ("model.layers.x=1", "model.layers.x"),
])
def test_malformed_overrides_name_the_key(text, field):
    with pytest.raises(SpecError) as info:
        apply_overrides({"name": "x", "model": dict(MODEL)}, [text])
    assert info.value.field == field


def test_override_errors_surface_through_load_spec():
    with pytest.raises(SpecError) as info:
        load_spec("qwen3_moe_tiny_smoke", ["policy.tp=two"], goldens_root=GOLDENS)
    assert info.value.field == "policy.tp" and "workload.yaml" in str(info.value)
    with pytest.raises(SpecError) as info:
        load_spec("qwen3_moe_tiny_smoke", ["rollout.tpp=2"], goldens_root=GOLDENS)
    assert info.value.field == "rollout.tpp"
    with pytest.raises(TopologyError) as info:
        load_spec("qwen3_moe_tiny_tp2pp2cp2ep2", ["policy.ep=3"], goldens_root=GOLDENS)
    assert info.value.field == "policy.ep"
    spec = load_spec("qwen3_moe_tiny_smoke", ["policy.dp=2", "grpo.iterations=1"], goldens_root=GOLDENS)
    assert spec["policy"]["dp"] == 2 and spec["grpo"]["iterations"] == 1


def test_digest_is_canonical(tmp_path):
    a = load_spec(_write(tmp_path, {"name": "d", "model": MODEL, "policy": {"optimizer": {"lr": 1}}}, "a.yaml"))
    b_doc = {"policy": {"optimizer": {"lr": 1.0}, "tp": 1}, "model": dict(reversed(list(MODEL.items()))), "name": "d"}
    b = load_spec(_write(tmp_path, b_doc, "b.yaml"))
    assert spec_digest(a) == spec_digest(b)
    assert len(spec_digest(a)) == 64
    c = load_spec(_write(tmp_path, {"name": "d", "model": MODEL, "seed": 1}, "c.yaml"))
    assert spec_digest(c) != spec_digest(a)


def test_yaml_exponent_floats_and_duplicate_keys(tmp_path):
    spec = load_spec(_write(tmp_path, "name: f\nmodel: {layers: 4, hidden: 64, heads: 8, kv_heads: 2, head_dim: 16,"
                                      " experts: 8, top_k: 2, moe_intermediate: 32, vocab: 256, rope_theta: 1e6}\n"
                                      "policy: {optimizer: {lr: 3e-4}}\n"))
    assert spec["model"]["rope_theta"] == 1e6 and spec["policy"]["optimizer"]["lr"] == 3e-4
    with pytest.raises(SpecError, match="duplicate key 'seed'"):
        load_spec(_write(tmp_path, "name: f\nseed: 1\nseed: 2\nmodel: {layers: 4}\n", "dup.yaml"))


def test_name_resolution(tmp_path, monkeypatch):
    (tmp_path / "alpha").mkdir()
    _write(tmp_path / "alpha", {"name": "alpha", "model": MODEL}, "workload.yaml")
    (tmp_path / "beta").mkdir()
    _write(tmp_path / "beta", {"name": "gamma", "model": MODEL}, "workload.yaml")
    (tmp_path / "not_a_workload").mkdir()
    assert list_workloads(tmp_path) == ["alpha", "beta"]
    assert load_spec("alpha", goldens_root=tmp_path)["name"] == "alpha"
    with pytest.raises(SpecError) as info:
        load_spec("beta", goldens_root=tmp_path)
    assert info.value.field == "name" and "beta" in str(info.value)
    with pytest.raises(SpecError) as info:
        load_spec("delta", goldens_root=tmp_path)
    assert info.value.field == "name" and "alpha" in info.value.message  # lists the known ones
    monkeypatch.setenv("GOLDEN_ROOT", str(tmp_path))
    assert default_goldens_root() == tmp_path
    assert load_spec("alpha")["name"] == "alpha"


def test_default_root_is_the_repo_goldens(monkeypatch):
    monkeypatch.delenv("GOLDEN_ROOT", raising=False)
    assert default_goldens_root() == GOLDENS


def test_unreadable_file_names_the_file(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "missing.yaml")
    assert "missing.yaml" in str(info.value)
