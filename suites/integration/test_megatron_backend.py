"""`policy.backend: megatron` (megatron-core GPTModel, CPU compatibility layer)
against the native backend from the same initial weights.

Skipped unless megatron-core is importable (`pip install megatron-core==0.16.1`).
Each layout spawns its world once (`suites.policy_jobs.curve_job`):
initial logprobs, 3 monolithic AdamW steps, the same 3 steps through the split
API after restoring the initial checkpoint, and the refit export (HF names).
Pipeline layouts (megatron-core's own 1F1B schedule over gloo) are compared
with the native backend and with the 1-rank megatron run; logprobs and metrics
come from the last stage, each dp rank holds its shard.

Tolerances (fp32, measured on the 2-core CPU box; see docs/megatron.md):
- initial logprobs: max |diff| <= 1e-5 (measured ~5e-7);
- loss and grad_norm per step: rel <= 1e-4 (measured <= ~1e-6);
- parameter checksums after 3 steps: rel <= 1e-4;
- exported initial weights: bit-identical to the reference model.
Adam eps is 1e-6 as in test_parallel_parity.py (router scale-invariance noise).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.policy.synthetic import synthetic_batch
from harness.spec import load_spec
from suites.local_world import checksums, spawn_world, with_layout
from suites.optional import MEGATRON
from suites.policy_jobs import curve_job

pytestmark = [MEGATRON, pytest.mark.megatron, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

STEPS = 3
LP_ATOL = 1e-5
REL = 1e-4
LAYOUTS = {
    "1rank": {},
    "tp2": {"tp": 2},
    "tp2_ep2": {"tp": 2, "ep": 2},
    "pp2": {"pp": 2},
    "pp2_uneven": {"pp": 2, "pp_layout": [1, 3]},
    "tp2_pp2_ep2_dp2": {"tp": 2, "pp": 2, "ep": 2, "dp": 2},  # 8 ranks
}
BATCH = 8


def _spec(backend: str, **layout):
    spec = load_spec(str(REPO / "goldens/qwen3_moe_tiny_tp2pp2cp2ep2/workload.yaml"))
    base = with_layout(
        spec, **{"tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "dp": 1, "pp_layout": None, "backend": backend, **layout}
    )
    base["policy"]["optimizer"] = {**base["policy"]["optimizer"], "eps": 1e-6}
    return base


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), 1e-12)


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    spec = _spec("native")
    batch = synthetic_batch(spec, BATCH, seed=0)
    (res,) = spawn_world(spec, curve_job, batch, STEPS, str(tmp_path_factory.mktemp("native")), timeout_s=240.0)
    return batch, res


@pytest.fixture(scope="module")
def megatron_1rank(native, tmp_path_factory):
    batch, _ = native
    (res,) = spawn_world(
        _spec("megatron"), curve_job, batch, STEPS, str(tmp_path_factory.mktemp("m1")), timeout_s=240.0
    )
    return res


def _compare(name: str, ref: dict, results: list[dict], dp: int, pp: int, what: str) -> None:
    r0 = results[0]
    n = BATCH // dp
    last = [r for r in results if r["mono"][0]]  # last-stage ranks produce metrics and logprobs
    others = [r for r in results if not r["mono"][0]]
    assert len(last) == len(results) // pp and all(r["logprobs0"].numel() for r in last)
    assert all(r["logprobs0"].numel() == 0 and not r["split"][0] for r in others)
    for r in last:  # each last-stage rank holds the logprobs of its dp shard
        d = r["coords"]["dp"]
        want = ref["logprobs0"][d * n : (d + 1) * n]
        assert (r["logprobs0"] - want).abs().max().item() <= LP_ATOL, f"{name} vs {what}: logprobs dp {d}"
        assert (r["ref_logprobs"] - want).abs().max().item() <= LP_ATOL, f"{name} vs {what}: reference logprobs dp {d}"
        for path in ("mono", "split"):
            for step, (m, x) in enumerate(zip(r[path], ref[path])):
                for key in ("loss", "grad_norm"):
                    assert _rel(x[key], m[key]) <= REL, (
                        f"{name} {path} step {step} {key}: {what} {x[key]} megatron {m[key]}"
                    )
                assert m["global_valid_toks"] == x["global_valid_toks"]
    for k, (s, sq, ab) in ref["mono_sums"].items():
        ms, msq, mab = r0["mono_sums"][k]
        assert _rel(sq, msq) <= REL and _rel(ab, mab) <= REL, f"{name} vs {what} {k}: {(s, sq, ab)} vs {(ms, msq, mab)}"


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_megatron_matches_native(native, megatron_1rank, name, tmp_path):
    batch, ref = native
    layout = LAYOUTS[name]
    spec = _spec("megatron", **layout)
    if name == "1rank":
        results = [megatron_1rank]
    else:
        results = spawn_world(spec, curve_job, batch, STEPS, str(tmp_path / "ckpt"), timeout_s=400.0)
    # refit export of the initial weights (gathered over every stage) is the reference model, bit for bit
    full = build_reference_model(ModelConfig.from_spec(spec), spec["seed"]).state_dict()
    assert results[0]["init_sums"] == checksums(full)
    dp, pp = layout.get("dp", 1), layout.get("pp", 1)
    _compare(name, ref, results, dp, pp, "native")
    if name != "1rank":
        _compare(name, megatron_1rank, results, dp, pp, "1-rank megatron")


def test_context_parallel_refused_without_te():
    pytest.importorskip("megatron.core")
    try:
        import transformer_engine  # noqa: F401
        pytest.skip("Transformer Engine is importable")
    except ImportError:
        pass
    from harness.policy.megatron.engine import MegatronLayoutError, check_layout

    with pytest.raises(MegatronLayoutError, match=r"policy\.cp=2.*Transformer Engine"):
        check_layout(_spec("megatron", cp=2))


def test_megatron_package_import_is_lazy():
    import subprocess
    import sys

    code = ("import sys, harness.policy.megatron, harness.policy.native.engine, harness.registry.policy; "
            "assert 'megatron.core' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_megatron_group_names_map_to_harness_kinds():
    from harness.policy.megatron.groups import harness_group_desc

    assert harness_group_desc("TENSOR_MODEL_PARALLEL_GROUP") == "tp"
    assert harness_group_desc("PIPELINE_MODEL_PARALLEL_GROUP") == "pp"
    assert harness_group_desc("EXPERT_DATA_PARALLEL_GROUP") == "edp"
    assert harness_group_desc("DATA_PARALLEL_GROUP_GLOO") == "dp_gloo"
    assert harness_group_desc("SOMETHING_NEW") == "megatron_something_new"
    assert harness_group_desc(None) is None


def test_megatron_golden_collectives_name_their_groups():
    """The stored golden's collectives surface shows megatron's own collectives
    (TP gathers, MoE all-to-alls, pipeline p2p) on harness-named groups."""
    import json
    from pathlib import Path

    path = Path(__file__).parents[2] / "goldens/qwen3_moe_tiny_megatron_tp2pp2ep2/cpu/surfaces/collectives.json"
    doc = json.loads(path.read_text())
    seen = {
        (op, kind)
        for sec in doc["sections"].values()
        for ph in sec["phases"].values()
        for op, kind, *_ in ph["collectives"]
    }
    kinds = {k for _, k in seen}
    assert kinds <= {"tp", "pp", "dp", "ep", "edp", "tp_ep", "default_pg", "rollout_tp"}, kinds
    for pair in [("all_to_all_single", "ep"), ("reduce_scatter_tensor", "tp"), ("all_gather_into_tensor", "tp"),
                 ("send", "pp"), ("recv", "pp"), ("all_reduce", "edp")]:
        assert pair in seen, pair
