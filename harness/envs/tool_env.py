"""`tool_calc`: a deterministic multi-turn calculator environment.

Episode: the user asks `Compute: <expr>` (prompts from
`make_task("tool_calc", seed)`). On each assistant turn the model may emit
`<tool_call>EXPR</tool_call>`; the environment evaluates the first such call
with a small integer calculator and appends a `tool` message (rendered by the
chat template as a `<tool_response>` user turn). The episode ends when an
assistant turn has no tool call (an answer) or when the assistant has spoken
`turns` times (the spec's `env.turns`; `turns=1` is single-turn). A turn
without a tool call is an answer: a correct answer ends the episode; a wrong
one gets a user message asking to try again while the budget lasts, so even a
random-init model produces real multi-turn episodes (what token capture and
prefix splicing are tested on).

Reward (only at the end; 0.0 on intermediate steps): 1.0 when the first
integer of the final turn's visible text (think and tool-call blocks and
control tokens removed) equals the value of the user's expression, else the
near-miss credit in [0, 0.5) of its first character against the value's first
digit (dense shaping, as the single-turn tasks have).

The environment is **stateless**: `step` is a pure function of the message
list and the new assistant text (the expression is re-read from the first
user message), so one instance serves any number of concurrent episodes and
replaying a transcript reproduces it exactly. Any text is accepted; malformed
or hostile tool calls get an `error: ...` tool message, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from harness.envs.tasks import Prompt, _first_char_reward, first_integer

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
EXPRESSION_PROMPT = re.compile(r"^Compute: (.+)$")

RETRY_PROMPT = "Not correct. Try again."
MAX_EXPRESSION_CHARS = 64
MAX_DEPTH = 8
MAX_MAGNITUDE = 10**12
MAX_LITERAL_DIGITS = 6


class CalcError(ValueError):
    """A tool call the calculator refuses (the message becomes the tool reply)."""


class _Parser:
    """Recursive descent over `expr := term (('+'|'-') term)*`,
    `term := factor ('*' factor)*`, `factor := '-' factor | '(' expr ')' | int`."""

    def __init__(self, text: str):
        self.text = text.replace(" ", "")
        self.pos = 0

    def parse(self) -> int:
        if not self.text:
            raise CalcError("empty expression")
        value = self._expr(0)
        if self.pos != len(self.text):
            raise CalcError(f"unexpected {self.text[self.pos]!r} at {self.pos}")
        return value

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _check(self, value: int) -> int:
        if abs(value) > MAX_MAGNITUDE:
            raise CalcError("overflow")
        return value

    def _expr(self, depth: int) -> int:
        value = self._term(depth)
        while self._peek() in ("+", "-") and self._peek():
            op = self._peek()
            self.pos += 1
            rhs = self._term(depth)
            value = self._check(value + rhs if op == "+" else value - rhs)
        return value

    def _term(self, depth: int) -> int:
        value = self._factor(depth)
        while self._peek() == "*":
            self.pos += 1
            value = self._check(value * self._factor(depth))
        return value

    def _factor(self, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise CalcError("nesting too deep")
        char = self._peek()
        if char == "-":
            self.pos += 1
            return -self._factor(depth + 1)
        if char == "(":
            self.pos += 1
            value = self._expr(depth + 1)
            if self._peek() != ")":
                raise CalcError("missing ')'")
            self.pos += 1
            return value
        start = self.pos
        while self._peek().isdigit() and self._peek() in "0123456789":
            self.pos += 1
        if start == self.pos:
            raise CalcError(f"expected a number at {start}" if char == "" else f"unexpected {char!r} at {start}")
        if self.pos - start > MAX_LITERAL_DIGITS:
            raise CalcError("number too long")
        return int(self.text[start : self.pos])


def evaluate(expression: str) -> int:
    """Value of an integer expression (`+ - *`, parentheses, unary minus).

    Raises `CalcError` for anything else, for more than `MAX_EXPRESSION_CHARS`
    characters, nesting deeper than `MAX_DEPTH` or |values| above `MAX_MAGNITUDE`.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError("expression too long")
    return _Parser(expression.strip()).parse()


def tool_reply(assistant_text: str) -> str | None:
    """The tool message content for the first tool call in the text, or None if none."""
    match = TOOL_CALL.search(assistant_text)
    if match is None:
        return None
    try:
        return str(evaluate(match.group(1)))
    except CalcError as exc:
        return f"error: {exc}"


class ToolCalcEnv:
    """Multi-turn calculator environment; see the module docstring."""

    name = "tool_calc"

    def __init__(self, turns: int = 2):
        if not isinstance(turns, int) or isinstance(turns, bool) or turns < 1:
            raise ValueError(f"env.turns must be an int >= 1, got {turns!r}")
        self.turns = turns

    def reset(self, prompt: Prompt | str) -> list[dict[str, str]]:
        """Opening messages for a `tool_calc` prompt (or its text)."""
        text = prompt.text if isinstance(prompt, Prompt) else prompt
        if not isinstance(text, str) or not EXPRESSION_PROMPT.match(text):
            raise ValueError(f"tool_calc prompt must look like 'Compute: <expr>', got {text!r}")
        return [{"role": "user", "content": text}]

    def expected_value(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """The value of the expression in the episode's first user message."""
        if not messages or messages[0].get("role") != "user":
            raise ValueError("tool_calc episode: messages[0] must be the user prompt")
        match = EXPRESSION_PROMPT.match(str(messages[0].get("content", "")))
        if match is None:
            raise ValueError(f"tool_calc episode: messages[0].content is not 'Compute: <expr>': {messages[0]!r}")
        return evaluate(match.group(1))

    def step(
        self, messages: Sequence[Mapping[str, Any]], assistant_text: str
    ) -> tuple[list[dict[str, str]], bool, float]:
        """Append the assistant turn (and a tool reply if the episode continues).

        Returns `(new_messages, done, reward)`; `messages` is not modified.
        """
        if not isinstance(assistant_text, str):
            raise TypeError(f"assistant_text must be str, got {type(assistant_text).__name__}")
        expected = self.expected_value(messages)
        new_messages = [dict(m) for m in messages]
        new_messages.append({"role": "assistant", "content": assistant_text})
        calls = sum(1 for m in new_messages if m["role"] == "assistant")
        reply = tool_reply(assistant_text)
        if reply is not None and calls < self.turns:
            new_messages.append({"role": "tool", "content": reply})
            return new_messages, False, 0.0
        correct = first_integer(assistant_text) == expected
        if not correct and reply is None and calls < self.turns:
            new_messages.append({"role": "user", "content": RETRY_PROMPT})
            return new_messages, False, 0.0
        reward = 1.0 if correct else _first_char_reward(str(expected)[0], assistant_text)
        return new_messages, True, reward
