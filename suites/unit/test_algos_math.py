"""Unit tests for harness.algos: masked means, KL, advantages, rollout metrics."""

from __future__ import annotations

import math

import pytest
import torch

from harness.algos import (
    baseline_and_std_per_prompt,
    calculate_kl,
    compute_advantages,
    expand_to_tokens,
    masked_mean,
    reward_metrics,
    rollout_metrics,
)


def test_masked_mean_local_and_global_denominators():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    assert masked_mean(x, mask).item() == pytest.approx(10.0 / 3.0)
    assert masked_mean(x, mask, 5.0).item() == pytest.approx(2.0)
    assert masked_mean(x, mask, dim=-1).tolist() == pytest.approx([2.0, 6.0])
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0
    poisoned = x.clone()
    poisoned[0, 1] = float("-inf")
    poisoned[1, 0] = float("nan")
    assert masked_mean(poisoned, mask).item() == pytest.approx(10.0 / 3.0)


def test_kl_types_match_their_formulas():
    curr = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    logr = ref - curr
    assert torch.equal(calculate_kl(curr, ref, kl_type="k1"), curr - ref)
    assert torch.allclose(calculate_kl(curr, ref, kl_type="k2"), logr**2 / 2)
    assert torch.allclose(calculate_kl(curr, ref, kl_type="k3"), torch.exp(logr) - 1 - logr)


def test_kl_clamps_and_unknown_type():
    curr = torch.tensor([0.0, 0.0])
    ref = torch.tensor([-50.0, 50.0])
    clamped = calculate_kl(curr, ref, kl_type="k1", input_clamp=20.0, output_clamp=10.0)
    assert clamped.tolist() == [10.0, -10.0]
    unclamped = calculate_kl(curr, ref, kl_type="k1", input_clamp=None, output_clamp=None)
    assert unclamped.tolist() == [50.0, -50.0]
    with pytest.raises(ValueError, match="kl_type"):
        calculate_kl(curr, ref, kl_type="k4")


def test_kl_importance_weights_detached_where_input_clamped():
    curr = torch.tensor([0.0, 0.0], requires_grad=True)
    ref = torch.tensor([-30.0, -0.1])
    weights = torch.exp(curr - curr.detach())
    kl = calculate_kl(curr, ref, kl_type="k1", input_clamp=20.0, output_clamp=None, importance_weights=weights)
    kl.sum().backward()
    # Clamped token: logr constant and weight detached -> no gradient at all.
    assert curr.grad[0].item() == 0.0
    assert curr.grad[1].item() != 0.0


def test_advantages_worked_example_loo_and_plain():
    prompts = torch.tensor([[1, 2], [1, 2], [1, 2], [3, 4], [3, 4], [5, 6]])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    # LOO: row 0 sees others [0, 0] (std 0 -> not normalised); rows 1, 2 see [1, 0].
    loo = compute_advantages(prompts, rewards)
    expected = [1.0, -0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6), 1.0, -1.0, 0.0]
    assert loo.tolist() == pytest.approx(expected, rel=1e-6)
    plain = compute_advantages(prompts, rewards, leave_one_out=False, normalize=False)
    assert plain.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.5, -0.5, 0.0], rel=1e-6)


def test_identical_prompt_rows_form_one_group_regardless_of_index():
    # Rows 0 and 2 are identical prompts from different dataset indices.
    prompts = torch.tensor([[7, 7], [8, 8], [7, 7], [8, 8]])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    baseline, _ = baseline_and_std_per_prompt(prompts, rewards, leave_one_out=False)
    assert baseline.tolist() == [0.5, 0.5, 0.5, 0.5]


def test_valid_mask_excludes_rows_from_group_statistics():
    prompts = torch.tensor([[1], [1], [1]])
    rewards = torch.tensor([1.0, 0.0, 100.0])
    adv = compute_advantages(prompts, rewards, valid_mask=torch.tensor([1.0, 1.0, 0.0]), normalize=False)
    assert adv.tolist() == [1.0, -1.0, 0.0]


def test_advantage_input_errors_name_the_argument():
    with pytest.raises(ValueError, match="prompt_ids"):
        compute_advantages(torch.tensor([1, 2]), torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="rewards"):
        compute_advantages(torch.tensor([[1], [2]]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="NaN"):
        compute_advantages(torch.tensor([[1], [2]]), torch.tensor([1.0, float("nan")]))


def test_expand_to_tokens_is_constant_per_row():
    token_mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    out = expand_to_tokens(torch.tensor([2.0, -1.0]), token_mask)
    assert out.tolist() == [[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]]


def test_reward_metrics_names_and_values():
    prompts = torch.tensor([[1], [1], [2], [2], [3], [3]])
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    adv = compute_advantages(prompts, rewards, leave_one_out=False, normalize=False)
    token_mask = torch.ones(6, 2)
    metrics = reward_metrics(prompts, rewards, adv, token_mask, leave_one_out=False)
    assert metrics["reward"] == pytest.approx(0.5)
    assert metrics["baseline_reward/pct_0"] == pytest.approx(100 * 2 / 6)
    assert metrics["baseline_reward/pct_1"] == pytest.approx(100 * 2 / 6)
    assert metrics["baseline_reward/pct_mixed"] == pytest.approx(100 * 2 / 6)
    assert metrics["advantages/max"] == pytest.approx(0.5)
    assert metrics["advantages/min"] == pytest.approx(-0.5)
    assert metrics["advantages/sum"] == pytest.approx(0.0)
    assert all(math.isfinite(v) for v in metrics.values())


def test_rollout_metrics_names_and_errors():
    metrics = rollout_metrics([10, 12], [4, 16], ["eos", "length"], turns=[1, 3], max_turns=3, env_lengths=[0, 6])
    assert metrics["mean_gen_tokens_per_sample"] == 10.0
    assert metrics["max_gen_tokens_per_sample"] == 16.0
    assert metrics["natural_termination_rate"] == 0.5
    assert metrics["truncation_rate"] == 0.5
    assert metrics["total_num_tokens"] == 48.0
    assert metrics["max_turns_reached_rate"] == 0.5
    assert metrics["mean_env_tokens_per_sample"] == 3.0
    with pytest.raises(ValueError, match="finish_reason"):
        rollout_metrics([1], [1], ["stop"])
    with pytest.raises(ValueError, match="one entry per sample"):
        rollout_metrics([1, 2], [1], ["eos"])
