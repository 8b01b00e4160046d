"""harness.spec.resources: the memory estimate of a spec, and the refusal of a local CPU run
this machine cannot hold, before anything starts (issue 42)."""

from __future__ import annotations

import pytest

from harness.cli import main
from harness.spec.load import load_spec
from harness.spec.resources import estimate, machine_memory_bytes, memory_refusal

GIB = 1 << 30


def test_the_parameter_count_matches_the_model_sizes_it_is_named_for():
    assert 2.3e11 < estimate(load_spec("nemo_rl_qwen3_235b")).parameters < 2.4e11  # Qwen3-235B-A22B
    tiny = estimate(load_spec("qwen3_moe_tiny_smoke"))
    assert 2e5 < tiny.parameters < 5e5 and tiny.total_bytes < 64 << 20


def test_sharding_divides_a_ranks_share():
    one = estimate(load_spec("qwen3_moe_tiny_smoke"))
    flagship = estimate(load_spec("qwen3_moe_tiny_tp2pp2cp2ep2"))  # the same model over TP2 PP2 CP2 EP2
    assert one.parameters == flagship.parameters
    assert flagship.policy_rank_bytes < one.policy_rank_bytes / 2
    assert flagship.activation_rank_bytes < one.activation_rank_bytes


@pytest.mark.parametrize(("override", "field"), [("model.layers=100000000", "model.layers"),
                                                 ("grpo.prompts_per_step=1000000000", "grpo.prompts_per_step")])
def test_a_run_too_large_for_the_machine_is_refused_naming_the_field(override, field, capsys):
    spec = load_spec("qwen3_moe_tiny_smoke", (override,))
    refused = memory_refusal(spec, 24 * GIB)
    assert refused is not None and refused.field == field and "GiB" in refused.message
    assert memory_refusal(load_spec("qwen3_moe_tiny_smoke"), 24 * GIB) is None
    assert memory_refusal(spec, None) is None  # memory unknown: nothing refused
    if machine_memory_bytes() is not None:  # golden plan refuses it too, before anything starts
        assert main(["plan", "qwen3_moe_tiny_smoke", override]) == 2
        err = capsys.readouterr().err  # the plan names the file too (harness.spec.runplan)
        assert err.startswith("golden plan: ") and f"workload.yaml: {field}: the run needs at least" in err


def test_meminfo_is_read_bounded_and_an_unreadable_one_is_none(tmp_path):
    good = tmp_path / "meminfo"
    good.write_text("MemTotal:       24576000 kB\nMemFree:        1000 kB\n")
    assert machine_memory_bytes(str(good)) == 24576000 * 1024
    assert machine_memory_bytes(str(tmp_path / "missing")) is None
    (tmp_path / "bad").write_text("MemTotal: lots\n")
    assert machine_memory_bytes(str(tmp_path / "bad")) is None
