"""Unit tests for harness.algos.loss.ClippedPGLoss and metric aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from harness.algos import ClippedPGLoss, aggregate_microbatch_metrics, global_valid_counts, rescale_metrics
from harness.spec.schema import section_defaults

DEFAULT_CFG = {**section_defaults("grpo.loss")}  # the spec's grpo.loss defaults


def make_batch(batch: int = 4, seq: int = 6, seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    token_mask = torch.zeros(batch, seq)
    token_mask[:, 2:] = 1.0
    token_mask[0, -1] = 0.0  # ragged lengths
    data = {
        "advantages": torch.randn(batch, seq, generator=gen),
        "prev_logprobs": -torch.rand(batch, seq, generator=gen) * 3,
        "generation_logprobs": -torch.rand(batch, seq, generator=gen) * 3,
        "reference_policy_logprobs": -torch.rand(batch, seq, generator=gen) * 3,
        "token_mask": token_mask,
        "sample_mask": torch.ones(batch),
    }
    curr = -torch.rand(batch, seq, generator=gen) * 3
    return curr, data


def test_hand_computed_single_token_loss():
    cfg = dict(DEFAULT_CFG, kl_beta=0.0)
    loss_fn = ClippedPGLoss(cfg)
    curr = torch.tensor([[0.0, math.log(0.5)]])
    data = {
        "advantages": torch.tensor([[0.0, 2.0]]),
        "prev_logprobs": torch.tensor([[0.0, math.log(0.25)]]),  # ratio 2 -> clamped 1.2
        "generation_logprobs": torch.tensor([[0.0, math.log(0.25)]]),
        "reference_policy_logprobs": torch.tensor([[0.0, math.log(0.25)]]),
        "token_mask": torch.tensor([[0.0, 1.0]]),
        "sample_mask": torch.tensor([1.0]),
    }
    loss, metrics = loss_fn(curr, data, 1, 1)
    # max(-2 * 2, -2 * 1.2) = -2.4
    assert loss.item() == pytest.approx(-2.4, rel=1e-6)
    assert metrics["probs_ratio"] == pytest.approx(2.0, rel=1e-6)
    assert metrics["probs_ratio_clamped"] == pytest.approx(1.2, rel=1e-6)
    assert metrics["kl_penalty"] == 0.0
    assert metrics["num_valid_samples"] == 1.0


def test_loss_is_differentiable_only_through_valid_tokens():
    curr, data = make_batch()
    data["sample_mask"][1] = 0.0
    curr.requires_grad_(True)
    seqs, toks = global_valid_counts(data)
    loss, _ = ClippedPGLoss(DEFAULT_CFG)(curr, data, seqs, toks)
    loss.backward()
    grad = curr.grad
    assert torch.all(grad[:, 0] == 0)  # column 0 is never a prediction
    assert torch.all(grad[1] == 0)  # masked sample
    assert torch.all(grad[0, -1] == 0)  # masked token
    assert grad[2, 3] != 0


def test_metric_normalizations_cover_returned_keys_for_every_mode():
    curr, data = make_batch()
    for overrides in ({}, {"token_level_loss": False}, {"use_importance_sampling_correction": True}, {"kl_beta": 0.0}):
        loss_fn = ClippedPGLoss(dict(DEFAULT_CFG, **overrides))
        _, metrics = loss_fn(curr, data, *global_valid_counts(data))
        assert set(metrics) == set(loss_fn.metric_normalizations), overrides
        assert loss_fn.metric_normalizations["loss"] == ("tokens" if loss_fn.token_level_loss else "sequences")


def test_importance_sampling_correction_weights_tokens():
    curr, data = make_batch()
    data["generation_logprobs"] = data["prev_logprobs"] - 0.1
    seqs, toks = global_valid_counts(data)
    plain_loss, _ = ClippedPGLoss(dict(DEFAULT_CFG, kl_beta=0.0))(curr, data, seqs, toks)
    is_loss, metrics = ClippedPGLoss(dict(DEFAULT_CFG, kl_beta=0.0, use_importance_sampling_correction=True))(
        curr, data, seqs, toks
    )
    assert metrics["sampling_importance_ratio"] == pytest.approx(math.exp(0.1), rel=1e-5)
    assert is_loss.item() == pytest.approx(plain_loss.item() * math.exp(0.1), rel=1e-5)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("kl_type", "k9", "grpo.loss.kl_type"),
        ("ratio_clip_min", -0.1, "grpo.loss.ratio_clip_min"),
        ("ratio_clip_min", 1.0, "grpo.loss.ratio_clip_min"),
        ("kl_output_clamp", 0, "grpo.loss.kl_output_clamp"),
        ("token_level_loss", "yes", "grpo.loss.token_level_loss"),
    ],
)
def test_bad_config_names_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        ClippedPGLoss(dict(DEFAULT_CFG, **{field: value}))


def test_unknown_and_missing_config_fields():
    with pytest.raises(ValueError, match="unknown field"):
        ClippedPGLoss(dict(DEFAULT_CFG, ratio_clip_c=3.0))
    cfg = dict(DEFAULT_CFG)
    del cfg["kl_beta"]
    with pytest.raises(ValueError, match="kl_beta"):
        ClippedPGLoss(cfg)


def test_bad_data_names_the_key():
    curr, data = make_batch()
    loss_fn = ClippedPGLoss(DEFAULT_CFG)
    broken = dict(data, prev_logprobs=data["prev_logprobs"][:, :-1])
    with pytest.raises(ValueError, match="prev_logprobs"):
        loss_fn(curr, broken, 1, 1)
    missing = {k: v for k, v in data.items() if k != "sample_mask"}
    with pytest.raises(ValueError, match="sample_mask"):
        loss_fn(curr, missing, 1, 1)


def test_aggregate_microbatch_metrics_min_max_sum_and_sentinels():
    combined = aggregate_microbatch_metrics(
        [
            {"loss": 0.25, "probs_ratio_min": 0.9, "probs_ratio_max": 1.1, "probs_ratio_clamped_min": float("inf")},
            {"loss": 0.5, "probs_ratio_min": 0.8, "probs_ratio_max": 1.05, "probs_ratio_clamped_min": float("inf")},
        ]
    )
    assert combined == {"loss": 0.75, "probs_ratio_min": 0.8, "probs_ratio_max": 1.1, "probs_ratio_clamped_min": -1.0}


def test_rescale_metrics_matches_direct_global_normalisation():
    curr, data = make_batch()
    loss_fn = ClippedPGLoss(dict(DEFAULT_CFG, token_level_loss=False))
    seqs, toks = global_valid_counts(data)
    _, direct = loss_fn(curr, data, seqs, toks)
    _, placeholder = loss_fn(curr, data, 1.0, 1.0)
    rescaled = rescale_metrics(placeholder, loss_fn.metric_normalizations, seqs, toks)
    for key, value in direct.items():
        assert rescaled[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    with pytest.raises(KeyError, match="not_a_metric"):
        rescale_metrics({"not_a_metric": 1.0}, loss_fn.metric_normalizations, seqs, toks)
