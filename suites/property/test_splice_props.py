"""Property tests for `replace_prefix_tokens` (its invariants 1-7)
and `PrefixCache`, plus a Qwen3-style chat template that strips earlier
reasoning blocks (positions shift, the EOS count does not).

The tokenizer is a stub (eos id + decode) as the reference allows; the chat
template below is local to this file (a token-level Qwen3-style renderer).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.capture.splice import PrefixCache, replace_prefix_tokens

EOS = 2


class StubTokenizer:
    def __init__(self, eos: int | None = EOS):
        self.eos_token_id = eos

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"<{t}>" for t in ids)


TOK = StubTokenizer()
ids = st.lists(st.integers(0, 6), max_size=30)  # small alphabet: EOS (2) is frequent


def strip_eos(xs: list[int]) -> list[int]:
    return xs[:-1] if xs and xs[-1] == EOS else xs


def kth_eos(xs: list[int], k: int) -> int | None:
    seen = 0
    for i, t in enumerate(xs):
        if t == EOS:
            seen += 1
            if seen == k:
                return i
    return None


@given(ids, ids)
def test_1_empty_model_prefix_is_identity(template_prefix: list[int], template: list[int]) -> None:
    assert replace_prefix_tokens(StubTokenizer(None), [], template_prefix, template) == template


@given(st.lists(st.integers(0, 6), min_size=1, max_size=30), ids, ids)
def test_2_3_7_structure_eos_count_and_length(model: list[int], template_prefix: list[int],
                                              template: list[int]) -> None:
    k = template_prefix.count(EOS)
    pos = kth_eos(template, k) if k else None
    if pos is None:
        with pytest.raises(AssertionError, match=f"could not find EOS number {k} "):  # invariant 5
            replace_prefix_tokens(TOK, model, template_prefix, template)
        return
    out = replace_prefix_tokens(TOK, model, template_prefix, template)
    cut = strip_eos(model)
    assert out == cut + template[pos:]  # 2
    assert out[: len(cut)] == cut and out[len(cut):] == template[pos:]
    assert out.count(EOS) == cut.count(EOS) + template[pos:].count(EOS)  # 3
    assert len(out) == len(model) - (model[-1] == EOS) + len(template) - pos  # 7
    # the spliced prompt always starts with the model's full prefix (its EOS is the template's)
    assert out[: len(model)] == model


@given(st.lists(st.integers(0, 6), max_size=20), st.lists(st.integers(0, 6), max_size=20))
def test_4_consistent_tokenisation_is_a_noop(head: list[int], tail: list[int]) -> None:
    template_prefix = head + [EOS]
    template = template_prefix + tail
    assert replace_prefix_tokens(TOK, template_prefix, template_prefix, template) == template


@given(st.lists(st.integers(0, 6), min_size=1), st.lists(st.integers(0, 6).filter(lambda t: t != EOS)), ids)
def test_5_no_eos_in_template_prefix_raises(model: list[int], template_prefix: list[int],
                                            template: list[int]) -> None:
    with pytest.raises(AssertionError, match="EOS"):
        replace_prefix_tokens(TOK, model, template_prefix, template)


@given(st.lists(st.integers(0, 6), min_size=1), ids, ids)
def test_5_missing_eos_id_raises(model: list[int], template_prefix: list[int], template: list[int]) -> None:
    with pytest.raises(AssertionError, match="no EOS token id"):
        replace_prefix_tokens(StubTokenizer(None), model, template_prefix, template)


@given(st.lists(st.integers(0, 6), min_size=1), ids, ids, st.randoms(use_true_random=False))
def test_6_template_prefix_matters_only_through_eos_count(model: list[int], template_prefix: list[int],
                                                          template: list[int], rnd) -> None:
    # Same EOS count, other tokens and positions changed.
    other = [t for t in template_prefix if t != EOS]
    other = [(t + 1) % 7 if (t + 1) % 7 != EOS else 0 for t in other]
    for _ in range(template_prefix.count(EOS)):
        other.insert(rnd.randint(0, len(other)), EOS)
    refusal = f"could not find EOS number {template_prefix.count(EOS)} "  # invariant 5, not any assert
    try:
        a = replace_prefix_tokens(TOK, model, template_prefix, template)
    except AssertionError as exc:
        assert refusal in str(exc), exc
        with pytest.raises(AssertionError, match=refusal):
            replace_prefix_tokens(TOK, model, other, template)
        return
    assert replace_prefix_tokens(TOK, model, other, template) == a


@given(st.lists(st.integers(0, 6), min_size=1), ids, ids)
def test_explicit_eos_overrides_tokenizer(model: list[int], template_prefix: list[int], template: list[int]) -> None:
    refusal = f"could not find EOS number {template_prefix.count(EOS)} "  # invariant 5, not any assert
    try:
        expected = replace_prefix_tokens(TOK, model, template_prefix, template)
    except AssertionError as exc:
        assert refusal in str(exc), exc
        with pytest.raises(AssertionError, match=refusal):
            replace_prefix_tokens(None, model, template_prefix, template, eos_token_id=EOS)
        return
    assert replace_prefix_tokens(None, model, template_prefix, template, eos_token_id=EOS) == expected
    assert replace_prefix_tokens(StubTokenizer(99), model, template_prefix, template, eos_token_id=EOS) == expected


# --- a Qwen3-style template that strips earlier reasoning -------------------------

IM_START, IM_END, NL = 1, EOS, 3
ROLE = {"system": 4, "user": 5, "assistant": 6, "tool": 7}
THINK_OPEN, THINK_CLOSE = 8, 9


def render(messages: list[tuple[str, list[int]]], add_generation_prompt: bool) -> list[int]:
    """`<|im_start|>role\\n content <|im_end|>\\n` per message. Assistant turns
    before the last user message lose their `<think>...</think>` block."""
    last_user = max((i for i, (r, _) in enumerate(messages) if r == "user"), default=-1)
    out: list[int] = []
    for i, (role, content) in enumerate(messages):
        if role == "assistant" and i < last_user and THINK_OPEN in content and THINK_CLOSE in content:
            a, b = content.index(THINK_OPEN), content.index(THINK_CLOSE)
            content = content[:a] + content[b + 1:]
        out += [IM_START, ROLE[role], NL] + content + [IM_END, NL]
    if add_generation_prompt:
        out += [IM_START, ROLE["assistant"], NL]
    return out


content = st.lists(st.integers(10, 40), min_size=1, max_size=8)


@st.composite
def agent_turns(draw):
    """A conversation driven by a model: each turn the model's exact tokens
    (with a think block, perhaps a tokenisation the template would not produce,
    perhaps cut by max_tokens without EOS) and then a user or tool observation."""
    turns = draw(st.integers(1, 4))
    obs = [(draw(st.sampled_from(["user", "tool"])), draw(content)) for _ in range(turns)]
    gens = []
    for _ in range(turns):
        think = [THINK_OPEN] + draw(content) + [THINK_CLOSE]
        answer = draw(content)
        stopped_on_eos = draw(st.booleans())
        gens.append((think + answer, stopped_on_eos))
    return draw(content), obs, gens


@given(agent_turns())
def test_multi_turn_with_think_stripping_keeps_exact_model_tokens(conv) -> None:
    system, observations, generations = conv
    messages = [("system", system), ("user", observations[0][1])]
    model_tokens: list[int] = []  # cumulative tokens as the engine saw/produced them
    prompt = render(messages, add_generation_prompt=True)
    for turn, (gen, stopped_on_eos) in enumerate(generations):
        assert prompt[: len(model_tokens)] == model_tokens  # prefix-consistent across calls
        model_tokens = prompt + gen + ([IM_END] if stopped_on_eos else [])
        # the agent records the assistant message as the model's text; the template
        # re-renders it (here: identical content tokens, think block included).
        messages.append(("assistant", gen))
        if turn + 1 == len(generations):
            break
        messages.append(observations[turn + 1])
        template_prefix = render(messages[:-1], add_generation_prompt=False)
        template = render(messages, add_generation_prompt=True)
        if observations[turn + 1][0] == "user":
            # earlier think blocks are stripped: the template no longer starts with the model's tokens
            assert template[: len(model_tokens)] != model_tokens or THINK_OPEN not in gen
        prompt = replace_prefix_tokens(TOK, model_tokens, template_prefix, template)
        assert prompt[: len(model_tokens)] == model_tokens
        # what follows the model's tokens is exactly the new observation turn + generation prompt
        role, obs = observations[turn + 1]
        expected_tail = [IM_END, NL, IM_START, ROLE[role], NL] + obs + [IM_END, NL, IM_START, ROLE["assistant"], NL]
        if stopped_on_eos:
            assert prompt[len(model_tokens) - 1:] == expected_tail
        else:
            assert prompt[len(model_tokens):] == expected_tail
        assert prompt.count(IM_END) == model_tokens.count(IM_END) + (0 if stopped_on_eos else 1) + 1


# --- PrefixCache -----------------------------------------------------------------

@given(st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=5), min_size=1, max_size=12),
       st.lists(st.integers(0, 11), max_size=20), st.integers(1, 4))
def test_prefix_cache_equals_uncached_concatenation_and_fetches_only_suffix(deltas, lookups, maxsize) -> None:
    rows = {f"r/c{i}": {"token_ids_delta": d} for i, d in enumerate(deltas)}
    keys = list(rows)
    fetched: list[list[str]] = []

    def fetch(ks: list[str]) -> list[dict]:
        fetched.append(list(ks))
        return [rows[k] for k in ks]

    cache = PrefixCache(maxsize=maxsize)
    for i in lookups:
        chain = keys[: i % len(keys) + 1]
        before = dict.fromkeys(k for k in chain if k in cache)
        got = cache.resolve(chain, fetch)
        assert got == [t for d in deltas[: len(chain)] for t in d]
        if chain[-1] in before:
            continue
        # only the keys after the deepest cached one were fetched
        deepest = max((j for j, k in enumerate(chain[:-1]) if k in before), default=-1)
        assert fetched[-1] == chain[deepest + 1:]
        assert len(cache) <= maxsize
    assert cache.hits + cache.misses == len(lookups)
