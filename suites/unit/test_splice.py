"""Example tests for `replace_prefix_tokens`: the edge cases NeMo RL pins
(docs/capture.md), with a Qwen3-like token layout (EOS = <|im_end|>)."""

from __future__ import annotations

import pytest

from harness.capture.splice import PrefixCache, replace_prefix_tokens

EOS = 151645  # Qwen3 <|im_end|>


class Tok:
    eos_token_id = EOS

    def decode(self, ids):
        return "|".join(map(str, ids))


def test_empty_model_prefix_returns_template_even_without_eos():
    class NoEos:
        eos_token_id = None

    assert replace_prefix_tokens(NoEos(), [], [1, 2], [7, 8, 9]) == [7, 8, 9]


def test_model_prefix_with_trailing_eos_is_not_duplicated():
    model = [10, 11, 50, 51, EOS]  # prompt 10 11, generated 50 51 EOS
    template_prefix = [10, 11, 52, EOS]  # template re-tokenised the answer differently
    template = [10, 11, 52, EOS, 198, 12, 13, EOS, 198, 14]
    assert replace_prefix_tokens(Tok(), model, template_prefix, template) == [10, 11, 50, 51, EOS, 198,
                                                                              12, 13, EOS, 198, 14]


def test_model_prefix_cut_by_max_tokens_gets_the_template_eos():
    model = [10, 11, 50, 51]  # stopped on max_tokens, no EOS
    out = replace_prefix_tokens(Tok(), model, [10, 11, 52, EOS], [10, 11, 52, EOS, 198, 12])
    assert out == [10, 11, 50, 51, EOS, 198, 12]


def test_newline_after_eos_is_kept_from_the_template():
    model = [1, 2, EOS]
    out = replace_prefix_tokens(Tok(), model, [1, 2, EOS, 198], [1, 2, EOS, 198, 5, EOS, 198, 6])
    assert out == [1, 2, EOS, 198, 5, EOS, 198, 6]


def test_multiple_eos_in_prefix_cuts_at_the_kth():
    template_prefix = [1, EOS, 2, EOS, 3, EOS]
    template = [1, EOS, 2, EOS, 3, EOS, 4, EOS, 5]
    model = [1, EOS, 2, EOS, 30, 31, EOS]
    assert replace_prefix_tokens(Tok(), model, template_prefix, template) == [1, EOS, 2, EOS, 30, 31, EOS, 4, EOS, 5]


def test_think_strip_shift_picks_the_assistant_eos_not_a_later_user_eos():
    think, endthink = 900, 901
    # prefix render keeps the think block; the full render strips it: positions shift by 3
    template_prefix = [5, 6, EOS, 7, think, 8, endthink, 9, EOS]
    template = [5, 6, EOS, 7, 9, EOS, 5, 10, EOS, 7]
    model = [5, 6, EOS, 7, think, 8, endthink, 9, EOS]
    out = replace_prefix_tokens(Tok(), model, template_prefix, template)
    assert out == model + [5, 10, EOS, 7]


def test_no_eos_in_template_prefix_raises_with_detokenised_text():
    with pytest.raises(AssertionError) as err:
        replace_prefix_tokens(Tok(), [1, 2], [1, 2], [1, 2, EOS])
    assert "EOS number 0" in str(err.value) and "template text '1|2|151645'" in str(err.value)


def test_too_few_eos_in_template_raises_naming_counts():
    with pytest.raises(AssertionError, match="EOS number 2 .* holds 1 EOS"):
        replace_prefix_tokens(Tok(), [1], [EOS, EOS], [3, EOS, 4])


def test_explicit_eos_without_tokenizer_has_no_decoded_text():
    with pytest.raises(AssertionError) as err:
        replace_prefix_tokens(None, [1], [EOS, EOS], [EOS], eos_token_id=EOS)
    assert "template text" not in str(err.value)
    assert replace_prefix_tokens(None, [1, EOS], [EOS], [EOS, 4], eos_token_id=EOS) == [1, EOS, 4]


def test_prefix_cache_lru_eviction_and_counters():
    rows = {f"r/{i}": {"token_ids_delta": [i]} for i in range(4)}
    calls = []

    def fetch(keys):
        calls.append(keys)
        return [rows[k] for k in keys]

    cache = PrefixCache(maxsize=2)
    assert cache.resolve(["r/0", "r/1"], fetch) == [0, 1]
    assert cache.resolve(["r/0", "r/1", "r/2"], fetch) == [0, 1, 2]
    assert calls[-1] == ["r/2"]  # only the uncached suffix
    assert cache.resolve(["r/0", "r/1", "r/2", "r/3"], fetch) == [0, 1, 2, 3]
    assert "r/1" not in cache  # evicted (LRU, 2 entries)
    assert cache.resolve(["r/0", "r/1", "r/2"], fetch) == [0, 1, 2]
    assert (cache.hits, cache.misses, cache.rows_fetched) == (1, 3, 4)
    with pytest.raises(ValueError, match="maxsize"):
        PrefixCache(0)
