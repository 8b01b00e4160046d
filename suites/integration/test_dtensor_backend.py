"""`policy.backend: dtensor` (torch DTensor: FSDP2 over dp, tensor parallel over tp,
gloo on CPU) against the native backend from the same spec, seed and batch.

Each layout spawns its world once (`suites.local_world.spawn_world` with
`suites.policy_jobs.curve_job`, backend-neutral): initial
logprobs, 3 monolithic AdamW steps, reference logprobs, the same 3 steps through
the split API after restoring the initial checkpoint, and the refit export.
Every dtensor rank computes logprobs and metrics (no pipeline); tp peers agree.

Tolerances (fp32; measured on the 2-core CPU box, docs/dtensor.md):
- logprobs and reference logprobs: max |diff| <= 1e-5 (measured ~1e-6);
- loss and grad_norm per step: rel <= 1e-5 (measured <= ~1e-6 abs);
- full-weight checksums after 3 steps: rel <= 1e-5;
- exported initial weights: bit-identical to the reference model.

LoRA (`policy.lora`): the frozen base is unchanged bit for bit after 3 steps,
only adapters are trained, and the refit export is exactly base + scale * B @ A.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.policy.synthetic import synthetic_batch
from harness.spec import load_spec
from suites.local_world import checksums, spawn_world, with_layout
from suites.policy_jobs import curve_job, export_job, lora_job

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
BATCH = 8
LP_ATOL = 1e-5
REL = 1e-5
LAYOUTS = {  # 4 and 8 ranks; at dp 4 the split API chunks of the 2-sample shard are 1 sample
    "dp2_tp2": {"dp": 2, "tp": 2},
    "dp4_tp2": {"dp": 4, "tp": 2, "micro_batch_size": 1},
}


def _spec(backend: str, **layout):
    spec = load_spec(str(REPO / "goldens/qwen3_moe_tiny_tp2pp2cp2ep2/workload.yaml"))
    base = with_layout(spec, **{"tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "dp": 1, "pp_layout": None,
                                "sp": False, "backend": backend, **layout})
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


def max_differences(ref: dict, results: list[dict], dp: int) -> dict[str, float]:
    """Max |dtensor - native| over ranks and steps (logprobs; loss and grad_norm of both train paths)."""
    n = BATCH // dp
    out = {"logprobs": 0.0, "ref_logprobs": 0.0, "loss": 0.0, "grad_norm": 0.0}
    for r in results:
        d = r["coords"]["dp"]
        want = ref["logprobs0"][d * n : (d + 1) * n]
        out["logprobs"] = max(out["logprobs"], (r["logprobs0"] - want).abs().max().item())
        out["ref_logprobs"] = max(out["ref_logprobs"], (r["ref_logprobs"] - want).abs().max().item())
        for path in ("mono", "split"):
            for m, x in zip(r[path], ref[path], strict=True):
                assert m["global_valid_toks"] == x["global_valid_toks"]
                for key in ("loss", "grad_norm"):
                    out[key] = max(out[key], _rel(x[key], m[key]))
    return out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_dtensor_matches_native(native, name, tmp_path):
    batch, ref = native
    layout = LAYOUTS[name]
    spec = _spec("dtensor", **layout)
    results = spawn_world(spec, curve_job, batch, STEPS, str(tmp_path / "ckpt"), timeout_s=500.0)
    assert len(results) == layout["dp"] * layout["tp"]
    full = build_reference_model(ModelConfig.from_spec(spec), spec["seed"]).state_dict()
    assert results[0]["init_sums"] == checksums(full)  # refit export of the initial weights, bit for bit
    diffs = max_differences(ref, results, layout["dp"])
    print(f"\n{name}: max differences vs native {diffs}")
    assert diffs["logprobs"] <= LP_ATOL and diffs["ref_logprobs"] <= LP_ATOL, diffs
    assert diffs["loss"] <= REL and diffs["grad_norm"] <= REL, diffs
    for k, (_s, sq, ab) in ref["mono_sums"].items():
        _ms, msq, mab = results[0]["mono_sums"][k]
        assert _rel(sq, msq) <= REL and _rel(ab, mab) <= REL, k


def test_lora_trains_adapters_only_and_exports_merged_weights():
    spec = _spec("dtensor", dp=2, tp=2)
    spec["policy"]["lora"] = {"enabled": True, "rank": 4, "alpha": 8.0, "dropout": 0.0,
                              "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    spec["policy"]["optimizer"] = {**spec["policy"]["optimizer"], "lr": 1e-2}
    batch = synthetic_batch(spec, BATCH, seed=0)
    res = spawn_world(spec, lora_job, batch, STEPS, timeout_s=400.0)[0]
    full = build_reference_model(ModelConfig.from_spec(spec), spec["seed"]).state_dict()
    scale = 8.0 / 4
    assert res["trained"] and all(".lora_" in n for n in res["trained"])
    assert res["optimized"] == len(res["trained"]) == 4 * 2 * full_layers(spec)
    for name, t in res["after"].items():  # the frozen base, bit for bit
        hf = name.replace(".base.", ".")
        assert torch.equal(t, res["before"][name]) and torch.equal(t, full[hf]), name
    moved = 0
    for name, t in res["after"].items():
        hf = name.replace(".base.", ".")
        if name.endswith(".base.weight"):
            prefix = name[: -len("base.weight")]
            a, b = res["adapters"][prefix + "lora_A.weight"], res["adapters"][prefix + "lora_B.weight"]
            moved += int(b.abs().max().item() > 0)
            assert torch.equal(res["exported"][hf], (t + scale * (b @ a)).to(t.dtype)), hf
        else:
            assert torch.equal(res["exported"][hf], t), hf
    assert moved == 4 * full_layers(spec)  # every B left zero: the adapters trained
    assert list(res["exported"]) == list(full)


def test_the_one_gather_export_is_every_full_tensor_bit_for_bit():
    """The refit export (harness.policy.dtensor.full_weights: one gather to rank 0, rebuilt by a
    map DTensor made) equals each parameter's own full_tensor() after training, at the golden's
    layout (dp 4 x tp 2: FSDP2's _StridedShard over tp's column shards, row shards, 1-D dp
    meshes), on the first export and on a later one."""
    spec = _spec("dtensor", **LAYOUTS["dp4_tp2"])
    batch = synthetic_batch(spec, BATCH, seed=0)
    res = spawn_world(spec, export_job, batch, 1, timeout_s=400.0)[0]
    assert res["flat"] == "FlatGather"
    assert list(res["exported"]) == list(build_reference_model(ModelConfig.from_spec(spec), spec["seed"]).state_dict())
    for name, t in res["one_by_one"].items():
        assert torch.equal(res["exported"][name], t) and torch.equal(res["again"][name], t), name


def full_layers(spec) -> int:
    return int(spec["model"]["layers"])
