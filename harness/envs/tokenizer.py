"""A small deterministic tokenizer with a Qwen3-style chat template.

The vocabulary (`harness/data/tokenizer/vocab.json`, package data, so an installed
wheel carries it) has exactly 256 entries, the
tiny model's vocab, so every id a model samples decodes to something:

- printable ASCII characters 32..126 have id = code point; tab and newline 9, 10;
- control tokens (`<|endoftext|>` pad, `<|im_end|>` EOS, `<|im_start|>`,
  `<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<tool_response>`,
  `</tool_response>`, `<|unk|>`, `<|reserved_N|>`);
- role word pieces (`system`, `user`, `assistant`, `tool`).

Encoding is greedy longest match (control tokens and word pieces are matched
inside plain text, as HF tokenizers do with added tokens); a character outside
the alphabet becomes `<|unk|>`. Invariants: `decode(encode(s)) == s` for any
string over the alphabet; `encode(decode(ids))` may differ from `ids` (a model
that spells `u s e r` one character at a time is re-encoded as the piece
`user`) -- the retokenisation drift that `replace_prefix_tokens` exists for.

The chat template (`chat_template.jinja`) renders one `<|im_end|>` per message
and strips `<think>` blocks of assistant messages before the last user query.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox

# Package data (pyproject [tool.setuptools.package-data]): the same path in a checkout and in a wheel.
DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "data" / "tokenizer"
VOCAB_FILE = "vocab.json"
TEMPLATE_FILE = "chat_template.jinja"
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


@dataclass
class Tokenizer:
    """Vocabulary + chat template; immutable after construction."""

    tokens: list[str]
    pad_token: str
    eos_token: str
    unk_token: str
    word_pieces: tuple[str, ...]
    chat_template: str
    source: str = "<memory>"
    _ids: dict[str, int] = field(init=False, repr=False)
    _multi_char: dict[int, dict[str, int]] = field(init=False, repr=False)
    _template: jinja2.Template = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._ids = {}
        for index, token in enumerate(self.tokens):
            if not isinstance(token, str) or token == "":
                raise ValueError(f"{self.source}: tokens[{index}] must be a non-empty string")
            if token in self._ids:
                raise ValueError(f"{self.source}: tokens[{index}] {token!r} duplicates id {self._ids[token]}")
            self._ids[token] = index
        for role, token in (("pad", self.pad_token), ("eos", self.eos_token), ("unk", self.unk_token)):
            if token not in self._ids:
                raise ValueError(f"{self.source}: special_tokens.{role} {token!r} is not in tokens")
        # Multi-character tokens grouped by length, longest tried first.
        self._multi_char = {}
        for token, index in self._ids.items():
            if len(token) > 1:
                self._multi_char.setdefault(len(token), {})[token] = index
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
        )
        try:
            self._template = env.from_string(self.chat_template)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"{self.source}: chat template does not parse: {exc}") from exc

    # -- vocabulary ----------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def eos_token_id(self) -> int:
        return self._ids[self.eos_token]

    @property
    def pad_token_id(self) -> int:
        return self._ids[self.pad_token]

    @property
    def unk_token_id(self) -> int:
        return self._ids[self.unk_token]

    def token_to_id(self, token: str) -> int:
        """Id of an exact vocabulary entry; `KeyError` naming the token otherwise."""
        try:
            return self._ids[token]
        except KeyError:
            raise KeyError(f"token {token!r} is not in the vocabulary ({self.source})") from None

    def is_control(self, token_id: int) -> bool:
        """True for control tokens (pad, EOS, <think>, reserved, ...), False for text."""
        token = self.tokens[token_id]
        return len(token) > 1 and token not in self.word_pieces

    @property
    def digest(self) -> str:
        """sha256 over vocabulary, special tokens and template (identifies the tokenizer)."""
        payload = json.dumps(
            [self.tokens, self.pad_token, self.eos_token, self.unk_token, list(self.word_pieces), self.chat_template],
            ensure_ascii=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    # -- text <-> ids --------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Greedy longest-match encoding; no BOS/EOS is added."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids: list[int] = []
        position, end = 0, len(text)
        lengths = sorted(self._multi_char, reverse=True)
        while position < end:
            for length in lengths:
                if position + length <= end:
                    match = self._multi_char[length].get(text[position : position + length])
                    if match is not None:
                        ids.append(match)
                        position += length
                        break
            else:
                ids.append(self._ids.get(text[position], self.unk_token_id))
                position += 1
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Concatenate token strings; an id outside [0, vocab_size) is a `ValueError`."""
        parts: list[str] = []
        for offset, token_id in enumerate(ids):
            token_id = int(token_id)
            if not 0 <= token_id < len(self.tokens):
                raise ValueError(
                    f"decode: ids[{offset}] = {token_id} is outside the vocabulary [0, {len(self.tokens)})"
                )
            if skip_special_tokens and self.is_control(token_id):
                continue
            parts.append(self.tokens[token_id])
        return "".join(parts)

    # -- chat ------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        *,
        enable_thinking: bool = True,
    ) -> list[int] | str:
        """Render `messages` (dicts with `role` and string `content`).

        Returns token ids (`tokenize=True`) or the rendered text. Roles must be
        one of `ROLES`; a bad message raises `ValueError` naming its index.
        """
        clean: list[dict[str, str]] = []
        for index, message in enumerate(messages):
            if not isinstance(message, Mapping):
                raise ValueError(f"messages[{index}] must be a mapping, got {type(message).__name__}")
            role, content = message.get("role"), message.get("content")
            if role not in ROLES:
                raise ValueError(f"messages[{index}].role must be one of {list(ROLES)}, got {role!r}")
            if not isinstance(content, str):
                raise ValueError(f"messages[{index}].content must be a string, got {type(content).__name__}")
            clean.append({"role": role, "content": content})
        text = self._template.render(
            messages=clean, add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking
        )
        return self.encode(text) if tokenize else text


def load_tokenizer(path: str | Path | None = None) -> Tokenizer:
    """Load `vocab.json` + `chat_template.jinja` from `path` (default: the package's data/tokenizer).

    Errors name the file and the field that is wrong.
    """
    directory = Path(path) if path is not None else DEFAULT_TOKENIZER_DIR
    vocab_path, template_path = directory / VOCAB_FILE, directory / TEMPLATE_FILE
    for required in (vocab_path, template_path):
        if not required.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {required}")
    try:
        doc = json.loads(vocab_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{vocab_path}: not valid JSON: {exc}") from exc
    for key in ("tokens", "special_tokens"):
        if key not in doc:
            raise ValueError(f"{vocab_path}: missing field {key!r}")
    if not isinstance(doc["tokens"], list):
        raise ValueError(f"{vocab_path}: field 'tokens' must be a list")
    special = doc["special_tokens"]
    for role in ("pad", "eos", "unk"):
        if role not in special:
            raise ValueError(f"{vocab_path}: missing field special_tokens.{role}")
    return Tokenizer(
        tokens=list(doc["tokens"]),
        pad_token=special["pad"],
        eos_token=special["eos"],
        unk_token=special["unk"],
        word_pieces=tuple(doc.get("word_pieces", ())),
        chat_template=template_path.read_text(encoding="utf-8"),
        source=str(vocab_path),
    )
