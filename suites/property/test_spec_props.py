"""Hypothesis over spec documents: overrides round-trip through their text
form, the digest ignores spelling (key order, int vs float, written-out
defaults), default filling is idempotent."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from harness.spec import SpecError, apply_overrides, spec_digest
from harness.spec.schema import defaults_tree, fill_defaults, validate
from harness.spec.yaml_io import parse_scalar

MODEL = {"layers": 4, "hidden": 64, "heads": 8, "kv_heads": 2, "head_dim": 16, "experts": 8,
         "top_k": 2, "moe_intermediate": 32, "vocab": 256}
INT_FIELDS = sorted(k for k, v in defaults_tree().items() if isinstance(v, int) and not isinstance(v, bool))


def _shuffled(value, rng: random.Random):
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    return value


@given(st.sampled_from(INT_FIELDS), st.integers(1, 10**6))
def test_int_override_round_trips(field, value):
    out = apply_overrides({"name": "p", "model": dict(MODEL)}, [f"{field}={value}"])
    node = out
    for part in field.split("."):
        node = node[part]
    assert node == value and type(node) is int


@given(st.text(max_size=30))
def test_any_override_text_either_applies_or_names_the_key(text):
    # Values are YAML-typed (so `no` is False and `[1` is an error); whatever the
    # text, the outcome is the parsed value or a SpecError naming the key.
    try:
        out = apply_overrides({"name": "p"}, [f"env.task={text}"])
    except SpecError as exc:
        assert exc.field == "env.task"
    else:
        value = parse_scalar(text)
        assert out["env"]["task"] == value or value != value  # NaN is never equal


@given(st.integers(0, 2**32), st.floats(1e-6, 1.0), st.booleans())
def test_digest_ignores_spelling(seed, lr, write_defaults):
    doc = {"name": "p", "model": dict(MODEL), "seed": seed, "policy": {"optimizer": {"lr": lr}}}
    a = fill_defaults(doc)
    other = fill_defaults(a) if write_defaults else doc
    b = fill_defaults(_shuffled(other, random.Random(seed)))
    assert spec_digest(a) == spec_digest(b)
    assert fill_defaults(a) == a  # idempotent
    validate(a)


@given(st.integers(1, 64))
def test_int_and_float_spellings_of_a_number_digest_alike(n):
    a = fill_defaults({"name": "p", "model": dict(MODEL), "policy": {"optimizer": {"max_grad_norm": n}}})
    b = fill_defaults({"name": "p", "model": dict(MODEL), "policy": {"optimizer": {"max_grad_norm": float(n)}}})
    assert spec_digest(a) == spec_digest(b)
    assert spec_digest(a) != spec_digest(fill_defaults({"name": "p", "model": dict(MODEL),
                                                        "policy": {"optimizer": {"max_grad_norm": n + 0.5}}}))


@given(
    st.sampled_from([".inf", "-.inf", ".nan"]),
    st.sampled_from(["policy.optimizer.lr", "rollout.temperature", "model.rope_theta"]),
)
def test_non_finite_numbers_are_rejected_by_field(text, field):
    doc = apply_overrides({"name": "p", "model": dict(MODEL)}, [f"{field}={text}"])
    try:
        validate(doc)
    except SpecError as exc:
        assert exc.field == field
    else:
        raise AssertionError(f"{field}={text} was accepted")
