"""Single-turn tasks with verifiable rewards, sized for a tiny random-init model.

A task turns `(seed, step, index)` into a `Prompt` deterministically (sha256
of those values seeds a private `random.Random`, so no global RNG, no Python
hash randomisation, same prompts in every process) and scores a response
text with `reward(prompt, text) -> float` in [0, 1].

Responses are graded on their *visible* text: `<think>...</think>` blocks,
tool-call blocks and control tokens (`<|...|>`, `<tool_response>` ...) are
removed first, then leading whitespace. Registered tasks (`TASKS`):

- `arith`: `"3+4="` -> `"7"` (single-digit sums). Learnable: full credit for
  the right first character, and a dense partial credit for near misses
  `0.5 * max(0, 1 - |ord(c) - ord(answer)| / 64)` so a random model already
  sees reward variance inside a group and mean reward rises within tens of
  GRPO steps.
- `parity`: `"parity 0110="` -> `"0"` or `"1"`; same first-character grading.
- `copy`: `"copy abc="` -> `"abc"`; `reverse`: `"reverse abc="` -> `"cba"`;
  credit = (matching leading characters + near-miss credit of the first
  wrong one) / answer length.
- `tool_calc`: `"Compute: 3*4+5"` -> `"17"`; 1.0 if the first integer of the
  visible text equals the value, else 0. Meant for `harness.envs.tool_env`.

`PromptLoader` hands out one batch per step and checkpoints its position.
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

_THINK_BLOCK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.DOTALL)
_CONTROL = re.compile(r"<\|[^<>|]*\|>|</?(?:think|tool_call|tool_response)>")
_INTEGER = re.compile(r"-?\d+")


def visible_text(response: str) -> str:
    """The part of a response a grader reads (see the module docstring)."""
    text = _THINK_BLOCK.sub("", response)
    text = _TOOL_CALL_BLOCK.sub("", text)
    text = _CONTROL.sub("", text)
    return text.lstrip()


def first_integer(response: str) -> int | None:
    """First integer in the visible text of `response`, or None."""
    match = _INTEGER.search(visible_text(response))
    return int(match.group()) if match else None


@dataclass(frozen=True)
class Prompt:
    """One task instance. `text` is the user message; `answer` the reference."""

    task: str
    step: int
    index: int
    text: str
    answer: str

    @property
    def uid(self) -> str:
        return f"{self.task}/step{self.step}/{self.index}"

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat for `apply_chat_template(..., add_generation_prompt=True)`."""
        return [{"role": "user", "content": self.text}]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Prompt:
        return cls(**{k: doc[k] for k in ("task", "step", "index", "text", "answer")})


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


NEAR_MISS_WIDTH = 64.0  # code points over which near-miss credit decays to 0


def _near_miss_credit(got: str, expected: str) -> float:
    """Partial credit in [0, 0.5) for a wrong character, by code-point distance.

    Dense shaping for a random-init model: about a third of its samples are
    printable characters that earn some credit, so GRPO groups have reward
    variance from the first step on.
    """
    return 0.5 * max(0.0, 1.0 - abs(ord(got) - ord(expected)) / NEAR_MISS_WIDTH)


def _first_char_reward(answer: str, response: str) -> float:
    text = visible_text(response)
    if not text:
        return 0.0
    return 1.0 if text[0] == answer else _near_miss_credit(text[0], answer)


def _prefix_reward(answer: str, response: str) -> float:
    """(matching leading characters + near-miss credit of the first wrong one) / len(answer)."""
    text = visible_text(response)
    credit = 0.0
    for expected, got in zip(answer, text):
        if expected != got:
            credit += _near_miss_credit(got, expected)
            break
        credit += 1.0
    return credit / len(answer)


# name -> (generator(rng) -> (text, answer), grader(answer, response) -> float)
Generator = Callable[[random.Random], tuple[str, str]]
Grader = Callable[[str, str], float]


def _gen_arith(rng: random.Random) -> tuple[str, str]:
    a = rng.randint(0, 9)
    b = rng.randint(0, 9 - a)
    return f"{a}+{b}=", str(a + b)


def _gen_parity(rng: random.Random) -> tuple[str, str]:
    bits = "".join(rng.choice("01") for _ in range(4))
    return f"parity {bits}=", str(bits.count("1") % 2)


def _gen_copy(rng: random.Random) -> tuple[str, str]:
    word = "".join(rng.choice(string.ascii_lowercase) for _ in range(3))
    return f"copy {word}=", word


def _gen_reverse(rng: random.Random) -> tuple[str, str]:
    word = "".join(rng.choice(string.ascii_lowercase) for _ in range(3))
    return f"reverse {word}=", word[::-1]


def _gen_tool_calc(rng: random.Random) -> tuple[str, str]:
    a, b, c = rng.randint(2, 12), rng.randint(2, 12), rng.randint(0, 20)
    return f"Compute: {a}*{b}+{c}", str(a * b + c)


def _grade_integer(answer: str, response: str) -> float:
    return 1.0 if first_integer(response) == int(answer) else 0.0


TASKS: dict[str, tuple[Generator, Grader]] = {
    "arith": (_gen_arith, _first_char_reward),
    "parity": (_gen_parity, _first_char_reward),
    "copy": (_gen_copy, _prefix_reward),
    "reverse": (_gen_reverse, _prefix_reward),
    "tool_calc": (_gen_tool_calc, _grade_integer),
}


@dataclass(frozen=True)
class Task:
    """A registered task bound to a seed. Pure: no state changes after creation."""

    name: str
    seed: int

    def prompt(self, step: int, index: int, *, seed: int | None = None) -> Prompt:
        """The prompt at (seed, step, index); `seed` defaults to the task's."""
        generator, _ = TASKS[self.name]
        use_seed = self.seed if seed is None else seed
        text, answer = generator(_rng(self.name, use_seed, step, index))
        return Prompt(task=self.name, step=step, index=index, text=text, answer=answer)

    def prompts(self, step: int, n: int, *, seed: int | None = None) -> list[Prompt]:
        """`n` prompts of `step` (indices 0..n-1)."""
        if n < 0:
            raise ValueError(f"prompts: n must be >= 0, got {n}")
        return [self.prompt(step, i, seed=seed) for i in range(n)]

    def reward(self, prompt: Prompt, response_text: str) -> float:
        """Verifiable reward in [0, 1] of `response_text` for `prompt`."""
        if prompt.task != self.name:
            raise ValueError(f"reward: prompt {prompt.uid} belongs to task {prompt.task!r}, not {self.name!r}")
        _, grader = TASKS[self.name]
        return float(grader(prompt.answer, response_text))


def make_task(name: str, seed: int) -> Task:
    """The task registered as `name` (the spec's `env.task`), bound to `seed`."""
    if name not in TASKS:
        raise ValueError(f"env.task: unknown task {name!r}; known: {sorted(TASKS)}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    return Task(name=name, seed=seed)


class PromptLoader:
    """Deterministic per-step batches of a task, resumable from `state_dict()`.

    Batch k (k = 0, 1, ...) is `task.prompts(k, prompts_per_step, seed=seed)`;
    the position `step` counts batches handed out. A loader restored from a
    state dict continues with exactly the batches the original would have
    produced next.
    """

    def __init__(self, task: Task, prompts_per_step: int, seed: int | None = None):
        if not isinstance(prompts_per_step, int) or prompts_per_step < 1:
            raise ValueError(f"grpo.prompts_per_step must be an int >= 1, got {prompts_per_step!r}")
        self.task = task
        self.prompts_per_step = prompts_per_step
        self.seed = task.seed if seed is None else seed
        self.step = 0

    def next_batch(self) -> list[Prompt]:
        batch = self.task.prompts(self.step, self.prompts_per_step, seed=self.seed)
        self.step += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "task": self.task.name,
            "seed": self.seed,
            "prompts_per_step": self.prompts_per_step,
            "step": self.step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the position; the task, seed and batch size must match."""
        for key in ("task", "seed", "prompts_per_step", "step"):
            if key not in state:
                raise ValueError(f"PromptLoader state is missing {key!r}")
        expected = {"task": self.task.name, "seed": self.seed, "prompts_per_step": self.prompts_per_step}
        for key, value in expected.items():
            if state[key] != value:
                raise ValueError(f"PromptLoader state field {key!r} is {state[key]!r}, this loader has {value!r}")
        step = state["step"]
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"PromptLoader state field 'step' must be an int >= 0, got {step!r}")
        self.step = step
