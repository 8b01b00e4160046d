"""Property tests for the GRPO math: every invariant of NeMo RL contracts §1.10.

KL 1-5, advantages 1-7, loss 1-5 and 7, plus the microbatch-sum property for
the loss *and* its metrics. Loss invariant 6 (config-incompatibility asserts
for CISPO / GSPO / TIS) has no counterpart: those features are not built, and
an unknown config field is refused (tested in suites/unit/test_algos_loss.py).
"""

from __future__ import annotations

import itertools
import math

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from harness.algos import (
    ClippedPGLoss,
    aggregate_microbatch_metrics,
    baseline_and_std_per_prompt,
    calculate_kl,
    compute_advantages,
    expand_to_tokens,
    global_valid_counts,
    masked_mean,
)
from harness.spec.schema import section_defaults
from suites.torch_state import torch_settings


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with torch_settings(threads=1):  # was set at import: for every test collected with this module
        yield


logprob = st.floats(min_value=-40.0, max_value=0.0, allow_nan=False, width=32)
reward = st.sampled_from([0.0, 0.25, 0.5, 1.0]) | st.floats(min_value=-5, max_value=5, allow_nan=False, width=32)


def vec(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


# ---------------------------------------------------------------- KL (1-5)

pairs = st.lists(st.tuples(logprob, logprob), min_size=1, max_size=32)


@given(pairs)
def test_kl1_k1_is_the_logprob_difference(xs):
    curr, ref = vec([a for a, _ in xs]), vec([b for _, b in xs])
    k1 = calculate_kl(curr, ref, kl_type="k1")
    inside = ((curr - ref).abs() <= 10.0)
    assert torch.equal(k1[inside], (curr - ref)[inside])


@given(pairs)
def test_kl2_k3_and_k2_are_non_negative_and_k3_zero_on_equal(xs):
    curr, ref = vec([a for a, _ in xs]), vec([b for _, b in xs])
    for kl_type in ("k2", "k3"):
        assert torch.all(calculate_kl(curr, ref, kl_type=kl_type) >= 0)
    assert torch.all(calculate_kl(curr, curr, kl_type="k3") == 0)
    clearly_different = (curr - ref).abs() > 1e-2
    assert torch.all(calculate_kl(curr, ref, kl_type="k3")[clearly_different] > 0)


@given(pairs, st.sampled_from(["k1", "k2", "k3"]), st.floats(min_value=0.5, max_value=15.0))
def test_kl3_output_clamp_bounds_and_no_clamp_when_disabled(xs, kl_type, out_clamp):
    curr, ref = vec([a for a, _ in xs]), vec([b for _, b in xs])
    clamped = calculate_kl(curr, ref, kl_type=kl_type, output_clamp=out_clamp)
    assert torch.all(clamped.abs() <= out_clamp)
    logr = ref.double() - curr.double()
    raw = {"k1": -logr, "k2": logr**2 / 2, "k3": torch.expm1(logr) - logr}[kl_type]
    free = calculate_kl(curr.double(), ref.double(), kl_type=kl_type, input_clamp=None, output_clamp=None)
    assert torch.allclose(free, raw, rtol=1e-12, atol=0)


@given(st.text(min_size=1, max_size=4).filter(lambda s: s not in ("k1", "k2", "k3")))
def test_kl4_unknown_type_raises(kl_type):
    with pytest.raises(ValueError, match="kl_type"):
        calculate_kl(vec([0.0]), vec([-1.0]), kl_type=kl_type)


@given(pairs, st.sampled_from(["k1", "k2", "k3"]))
def test_kl5_unit_weights_change_nothing(xs, kl_type):
    curr, ref = vec([a for a, _ in xs]), vec([b for _, b in xs])
    weighted = calculate_kl(curr, ref, kl_type=kl_type, importance_weights=torch.ones_like(curr))
    assert torch.equal(weighted, calculate_kl(curr, ref, kl_type=kl_type))


# ---------------------------------------------------------- advantages (1-7)

rows = st.lists(st.tuples(st.integers(0, 3), reward), min_size=1, max_size=16)


def batch_from(rows_):
    prompts = torch.tensor([[g, 100 + g, 7] for g, _ in rows_])
    rewards = vec([r for _, r in rows_])
    return prompts, rewards


def groups_of(prompts):
    return torch.unique(prompts, dim=0, return_inverse=True)[1]


@given(rows, st.booleans(), st.booleans(), st.randoms(use_true_random=False))
def test_adv1_permutation_equivariance_is_bit_exact(rows_, loo, normalize, rnd):
    prompts, rewards = batch_from(rows_)
    perm = list(range(len(rows_)))
    rnd.shuffle(perm)
    perm_t = torch.tensor(perm)
    adv = compute_advantages(prompts, rewards, leave_one_out=loo, normalize=normalize)
    adv_perm = compute_advantages(prompts[perm_t], rewards[perm_t], leave_one_out=loo, normalize=normalize)
    assert torch.equal(adv_perm, adv[perm_t])


@given(rows, st.booleans())
def test_adv2_unnormalised_advantages_sum_to_zero_per_group(rows_, loo):
    prompts, rewards = batch_from(rows_)
    adv = compute_advantages(prompts, rewards, leave_one_out=loo, normalize=False).double()
    groups = groups_of(prompts)
    for g in groups.unique():
        members = groups == g
        scale = max(1.0, float(rewards[members].abs().max()))
        assert abs(float(adv[members].sum())) <= 1e-5 * scale * int(members.sum())


@given(st.integers(1, 8), reward, st.booleans(), st.booleans())
def test_adv3_equal_rewards_give_exactly_zero(n, r, loo, normalize):
    prompts = torch.zeros(n, 3, dtype=torch.long)
    adv = compute_advantages(prompts, vec([r] * n), leave_one_out=loo, normalize=normalize)
    assert torch.all(adv == 0)


@given(st.lists(reward, min_size=1, max_size=10), st.booleans(), st.booleans())
def test_adv4_singleton_groups_give_zero(rs, loo, normalize):
    prompts = torch.arange(len(rs))[:, None].repeat(1, 2)
    adv = compute_advantages(prompts, vec(rs), leave_one_out=loo, normalize=normalize)
    assert torch.all(adv == 0)


@given(reward, reward)
def test_adv5_two_samples_with_loo_are_not_normalised(r1, r2):
    prompts = torch.zeros(2, 3, dtype=torch.long)
    rewards = vec([r1, r2])
    _, std = baseline_and_std_per_prompt(prompts, rewards, leave_one_out=True)
    assert torch.all(std == 0)
    adv = compute_advantages(prompts, rewards, leave_one_out=True, normalize=True)
    assert torch.allclose(adv, vec([r1 - r2, r2 - r1]), rtol=1e-6, atol=1e-6)


@given(rows, st.integers(1, 9))
def test_adv6_token_broadcast_has_mask_shape_and_is_constant(rows_, seq):
    prompts, rewards = batch_from(rows_)
    token_mask = torch.ones(len(rows_), seq)
    token_mask[:, 0] = 0
    out = expand_to_tokens(compute_advantages(prompts, rewards), token_mask)
    assert out.shape == token_mask.shape
    assert torch.all(out == out[:, :1])


@given(rows, st.booleans())
def test_adv7_normalised_advantages_are_finite(rows_, loo):
    prompts, rewards = batch_from(rows_)
    adv = compute_advantages(prompts, rewards, leave_one_out=loo, normalize=True)
    assert torch.all(torch.isfinite(adv))


# ---------------------------------------------------------------- loss

CFG = {**section_defaults("grpo.loss"), "ratio_clip_max": 0.28}  # the spec's grpo.loss defaults


@st.composite
def loss_batches(draw, equal_lengths: bool = False):
    batch = draw(st.integers(1, 6))
    seq = draw(st.integers(2, 8))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    token_mask = (torch.rand(batch, seq, generator=gen) < 0.7).float()
    if equal_lengths:
        valid = draw(st.integers(1, seq - 1))
        token_mask = torch.zeros(batch, seq)
        token_mask[:, seq - valid :] = 1.0
    token_mask[:, 0] = 0.0
    sample_mask = (torch.rand(batch, generator=gen) < 0.8).float()
    if equal_lengths:
        sample_mask = torch.ones(batch)
    data = {
        "advantages": torch.randn(batch, 1, generator=gen).expand(batch, seq).clone(),
        "prev_logprobs": -torch.rand(batch, seq, generator=gen) * 4,
        "generation_logprobs": -torch.rand(batch, seq, generator=gen) * 4,
        "reference_policy_logprobs": -torch.rand(batch, seq, generator=gen) * 4,
        "token_mask": token_mask,
        "sample_mask": sample_mask,
    }
    curr = data["prev_logprobs"] + 0.5 * torch.randn(batch, seq, generator=gen)
    return curr, data


def loss_config(draw_token_level: bool, is_correction: bool = False, beta: float = 0.01) -> dict:
    return dict(CFG, token_level_loss=draw_token_level, use_importance_sampling_correction=is_correction, kl_beta=beta)


@given(loss_batches(), st.booleans())
def test_loss1_on_policy_without_kl_is_minus_mean_advantage(batch, token_level):
    _, data = batch
    curr = data["prev_logprobs"].clone()
    data = dict(data, generation_logprobs=curr.clone())
    seqs, toks = global_valid_counts(data)
    loss_fn = ClippedPGLoss(loss_config(token_level, beta=0.0))
    loss, metrics = loss_fn(curr, data, seqs, toks)
    adv = data["advantages"][:, 1:]
    mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    if token_level:
        expected = -masked_mean(adv, mask, toks)
    else:
        expected = -masked_mean(masked_mean(adv, mask, dim=-1), data["sample_mask"], seqs)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    valid_fraction = mask.sum().item() / (toks + 1e-8)
    assert metrics["probs_ratio"] == pytest.approx(valid_fraction, rel=1e-6)
    assert metrics["probs_ratio_clamped"] == pytest.approx(valid_fraction, rel=1e-6)
    if mask.sum() > 0:
        assert metrics["probs_ratio_min"] == metrics["probs_ratio_max"] == 1.0


@given(loss_batches(), st.booleans(), st.booleans(), st.data())
def test_loss2_microbatch_losses_and_metrics_sum_to_the_batch(batch, token_level, is_corr, data_strategy):
    curr, data = batch
    size = curr.shape[0]
    cuts = sorted(set(data_strategy.draw(st.lists(st.integers(1, max(size - 1, 1)), max_size=3))))
    bounds = [0] + [c for c in cuts if 0 < c < size] + [size]
    loss_fn = ClippedPGLoss(loss_config(token_level, is_corr))
    seqs, toks = global_valid_counts(data)
    whole_loss, whole_metrics = loss_fn(curr, data, seqs, toks)
    losses, mb_metrics = [], []
    for lo, hi in itertools.pairwise(bounds):
        mb = {k: v[lo:hi] for k, v in data.items()}
        mb_loss, metrics = loss_fn(curr[lo:hi], mb, seqs, toks)
        losses.append(mb_loss)
        mb_metrics.append(metrics)
    assert torch.stack(losses).sum().item() == pytest.approx(whole_loss.item(), rel=1e-5, abs=1e-6)
    combined = aggregate_microbatch_metrics(mb_metrics)
    whole = aggregate_microbatch_metrics([whole_metrics])
    for key, value in whole.items():
        assert combined[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@given(loss_batches(equal_lengths=True))
def test_loss3_token_and_sequence_level_coincide_for_equal_lengths(batch):
    curr, data = batch
    seqs, toks = global_valid_counts(data)
    token_loss, _ = ClippedPGLoss(loss_config(True))(curr, data, seqs, toks)
    seq_loss, _ = ClippedPGLoss(loss_config(False))(curr, data, seqs, toks)
    assert token_loss.item() == pytest.approx(seq_loss.item(), rel=1e-5, abs=1e-6)


@given(loss_batches(), st.floats(0.0, 0.9), st.floats(0.0, 2.0))
def test_loss4_clamped_ratio_within_bounds(batch, clip_min, clip_max):
    curr, data = batch
    loss_fn = ClippedPGLoss(dict(CFG, ratio_clip_min=clip_min, ratio_clip_max=clip_max))
    _, metrics = loss_fn(curr, data, *global_valid_counts(data))
    if not math.isinf(metrics["probs_ratio_clamped_min"]):
        assert metrics["probs_ratio_clamped_min"] >= (1 - clip_min) * (1 - 1e-6)
        assert metrics["probs_ratio_clamped_max"] <= (1 + clip_max) * (1 + 1e-6)


@given(loss_batches(), st.booleans(), st.integers(0, 2**31 - 1))
def test_loss5_masked_samples_contribute_nothing(batch, token_level, seed):
    curr, data = batch
    off = data["sample_mask"] == 0
    gen = torch.Generator().manual_seed(seed)
    scrambled = {k: v.clone() for k, v in data.items()}
    curr_scrambled = curr.clone()
    for key in ("advantages", "prev_logprobs", "generation_logprobs", "reference_policy_logprobs"):
        scrambled[key][off] = -torch.rand(int(off.sum()), curr.shape[1], generator=gen) * 10
    curr_scrambled[off] = -torch.rand(int(off.sum()), curr.shape[1], generator=gen) * 10
    scrambled["token_mask"][off] = 1.0
    loss_fn = ClippedPGLoss(loss_config(token_level, True))
    seqs, toks = global_valid_counts(data)
    loss_a, metrics_a = loss_fn(curr, data, seqs, toks)
    loss_b, metrics_b = loss_fn(curr_scrambled, scrambled, seqs, toks)
    assert loss_a.item() == loss_b.item()
    assert metrics_a == metrics_b


@given(loss_batches(), st.booleans(), st.booleans(), st.sampled_from([0.0, 0.05]))
def test_loss7_metric_normalizations_cover_every_key(batch, token_level, is_corr, beta):
    curr, data = batch
    loss_fn = ClippedPGLoss(loss_config(token_level, is_corr, beta))
    _, metrics = loss_fn(curr, data, *global_valid_counts(data))
    assert set(metrics) == set(loss_fn.metric_normalizations)
    assert set(loss_fn.metric_normalizations.values()) <= {"tokens", "sequences", "none"}
