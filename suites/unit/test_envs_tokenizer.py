"""Tokenizer and chat template: round trips, special tokens, Qwen3 think stripping."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.envs.tokenizer import DEFAULT_TOKENIZER_DIR, load_tokenizer

TOK = load_tokenizer()
ALPHABET = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")


def test_vocab_fits_the_tiny_model_and_names_its_special_tokens():
    assert TOK.vocab_size == 256
    assert TOK.tokens[TOK.eos_token_id] == "<|im_end|>"
    assert TOK.tokens[TOK.pad_token_id] == "<|endoftext|>"
    for token in ("<|im_start|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>", "user", "assistant", "system", "tool"):
        assert TOK.encode(token) == [TOK.token_to_id(token)]


@given(st.text(alphabet=ALPHABET, max_size=80))
def test_decode_encode_round_trip_over_the_alphabet(text):
    assert TOK.decode(TOK.encode(text)) == text


@given(st.lists(st.integers(0, 255), max_size=40))
def test_every_model_id_decodes(ids):
    text = TOK.decode(ids)
    # Re-encoding may merge characters into pieces (retokenisation drift) but
    # never loses text.
    assert TOK.decode(TOK.encode(text)) == text


def test_retokenisation_drift_exists():
    spelled = [TOK.token_to_id(c) for c in "user"]
    assert TOK.encode(TOK.decode(spelled)) == [TOK.token_to_id("user")]


def test_unknown_characters_and_bad_ids():
    assert TOK.encode("é") == [TOK.unk_token_id]
    with pytest.raises(ValueError, match=r"ids\[1\] = 256"):
        TOK.decode([65, 256])
    assert TOK.decode([TOK.eos_token_id, 65], skip_special_tokens=True) == "A"


def test_chat_template_one_eos_per_message_and_generation_prompt():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+3="},
        {"role": "assistant", "content": "5"},
    ]
    text = TOK.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n2+3=<|im_end|>\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = TOK.apply_chat_template(messages, add_generation_prompt=True)
    assert ids.count(TOK.eos_token_id) == len(messages)
    no_think = TOK.apply_chat_template(messages[:2], True, tokenize=False, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_earlier_think_blocks_are_stripped_but_eos_count_is_kept():
    history = [
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n2"},
    ]
    prefix = TOK.apply_chat_template(history, add_generation_prompt=False)
    full = TOK.apply_chat_template(history + [{"role": "user", "content": "2+2="}], add_generation_prompt=True)
    assert "<think>" in TOK.decode(prefix)
    assert "<think>" not in TOK.decode(full)
    # The k-th EOS of the full render (k = EOS count of the prefix) closes the
    # assistant turn: exactly what replace_prefix_tokens relies on.
    k = prefix.count(TOK.eos_token_id)
    positions = [i for i, t in enumerate(full) if t == TOK.eos_token_id]
    assert positions[k - 1] < len(prefix) - 2  # the stripped block shifted the assistant EOS left
    tail = TOK.decode(full[positions[k - 1]:])
    assert tail == "<|im_end|>\n<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n"
    assert TOK.decode(full[: positions[k - 1]]).endswith("<|im_start|>assistant\n2")


def test_think_kept_after_last_query_and_tool_turns_grouped():
    messages = [
        {"role": "user", "content": "Compute: 2*3+1"},
        {"role": "assistant", "content": "<think>use tool</think><tool_call>2*3+1</tool_call>"},
        {"role": "tool", "content": "7"},
        {"role": "tool", "content": "7"},
    ]
    text = TOK.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>assistant\n<think>\nuse tool\n</think>\n\n<tool_call>2*3+1</tool_call><|im_end|>\n" in text
    assert text.count("<|im_start|>user") == 2  # the two tool messages form one user turn
    assert "<tool_response>\n7\n</tool_response>\n<tool_response>\n7\n</tool_response><|im_end|>" in text


@pytest.mark.parametrize(
    ("message", "field"),
    [({"role": "robot", "content": "x"}, "role"), ({"role": "user", "content": 3}, "content")],
)
def test_bad_messages_name_index_and_field(message, field):
    with pytest.raises(ValueError, match=rf"messages\[1\]\.{field}"):
        TOK.apply_chat_template([{"role": "user", "content": "hi"}, message])


def test_load_errors_name_file_and_field(tmp_path):
    with pytest.raises(FileNotFoundError, match="vocab.json"):
        load_tokenizer(tmp_path)
    doc = json.loads((DEFAULT_TOKENIZER_DIR / "vocab.json").read_text())
    doc["special_tokens"]["eos"] = "<|nope|>"
    (tmp_path / "vocab.json").write_text(json.dumps(doc))
    (tmp_path / "chat_template.jinja").write_text((DEFAULT_TOKENIZER_DIR / "chat_template.jinja").read_text())
    with pytest.raises(ValueError, match="special_tokens.eos"):
        load_tokenizer(tmp_path)


def test_digest_is_stable_and_content_addressed(tmp_path):
    assert load_tokenizer().digest == TOK.digest
    assert len(TOK.digest) == 64
    # content, not location: a copy elsewhere digests alike, one changed byte does not
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("vocab.json", "chat_template.jinja"):
        (copy / name).write_bytes((DEFAULT_TOKENIZER_DIR / name).read_bytes())
    assert load_tokenizer(copy).digest == TOK.digest
    template = copy / "chat_template.jinja"
    template.write_text(template.read_text() + "\n")
    assert load_tokenizer(copy).digest != TOK.digest
