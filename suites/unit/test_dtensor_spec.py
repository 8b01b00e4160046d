"""Spec rules of the dtensor policy backend and of `policy.lora` (gate half: no torch).

The dtensor backend runs FSDP2 over dp x tensor parallel over tp only, so a spec
asking it for pp/cp/ep/etp > 1 or sequence parallel is refused up front naming the
field; LoRA on any other backend is refused naming that backend; an absent
`policy.lora` stays absent (existing workloads' spec digests do not move)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.spec import load_spec
from harness.spec.errors import SpecError, TopologyError

REPO = Path(__file__).resolve().parents[2]
FLAGSHIP = str(REPO / "goldens/qwen3_moe_tiny_tp2pp2cp2ep2/workload.yaml")
DTENSOR = ["policy.backend=dtensor", "policy.pp=1", "policy.cp=1", "policy.ep=1", "policy.sp=false",
           "policy.dp=4", "policy.tp=2"]


def test_dtensor_dp4_tp2_without_sp_loads():
    spec = load_spec(FLAGSHIP, DTENSOR)
    assert spec["policy"]["backend"] == "dtensor" and "lora" not in spec["policy"]


@pytest.mark.parametrize("override, field", [
    ("policy.ep=2", "policy.ep"), ("policy.pp=2", "policy.pp"), ("policy.cp=2", "policy.cp"),
    ("policy.sp=true", "policy.sp"),
])
def test_dtensor_refuses_what_it_does_not_run(override, field):
    overrides = [o for o in DTENSOR if not o.startswith(override.split("=")[0] + "=")] + [override]
    if override == "policy.pp=2" or override == "policy.cp=2":
        overrides = [o for o in overrides if not o.startswith("policy.dp=")] + ["policy.dp=2"]
    with pytest.raises(TopologyError) as info:
        load_spec(FLAGSHIP, overrides)
    assert info.value.field == field
    assert "dtensor" in str(info.value)


def test_sp_rule_still_binds_the_native_backend():
    with pytest.raises(TopologyError) as info:
        load_spec(FLAGSHIP, ["policy.sp=false"])
    assert info.value.field == "policy.sp"


def test_dtensor_refuses_replicated_kv_heads():
    with pytest.raises(TopologyError) as info:  # kv_heads 2 < tp 4: native replicates, dtensor cannot
        load_spec(FLAGSHIP, [o for o in DTENSOR if not o.startswith(("policy.tp=", "policy.dp="))]
                  + ["policy.tp=4", "policy.dp=2"])
    assert info.value.field == "policy.tp" and "kv_heads" in str(info.value)


@pytest.mark.parametrize("backend", ["native", "megatron"])
def test_lora_is_refused_on_a_backend_without_it_naming_the_backend(backend):
    with pytest.raises(TopologyError) as info:
        load_spec(FLAGSHIP, [f"policy.backend={backend}", "policy.cp=1", "policy.dp=2", "policy.lora.enabled=true"])
    assert info.value.field == "policy.lora.enabled"
    assert f"the {backend} policy backend has no LoRA" in str(info.value)


def test_lora_block_is_filled_and_checked():
    spec = load_spec(FLAGSHIP, DTENSOR + ["policy.lora.enabled=true"])
    assert spec["policy"]["lora"] == {"enabled": True, "rank": 8, "alpha": 16.0, "dropout": 0.0,
                                      "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    with pytest.raises(SpecError) as info:
        load_spec(FLAGSHIP, DTENSOR + ["policy.lora.enabled=true", "policy.lora.target_modules=[gate_proj]"])
    assert "policy.lora.target_modules" in str(info.value)
