"""One episode interface over single-turn tasks and the multi-turn tool env.

``reset(prompt) -> messages`` and ``step(prompt, messages, text) -> (messages,
done, reward)``; the rollout driver knows nothing else about environments.
"""

from __future__ import annotations

from harness.envs.tasks import Prompt, Task
from harness.spec.typed import EnvSpec


class SingleTurnEpisodes:
    """A task prompt, one model call, the task's verifiable reward."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def reset(self, prompt: Prompt) -> list[dict]:
        return [dict(m) for m in prompt.messages]

    def step(self, prompt: Prompt, messages: list[dict], text: str) -> tuple[list[dict], bool, float]:
        new = [*messages, {"role": "assistant", "content": text}]
        return new, True, self.task.reward(prompt, text)


class ToolEpisodes:
    """The multi-turn ``tool_calc`` environment (model call -> tool reply -> next call)."""

    def __init__(self, turns: int) -> None:
        from harness.envs.tool_env import ToolCalcEnv

        self.env = ToolCalcEnv(turns=turns)

    def reset(self, prompt: Prompt) -> list[dict]:
        return self.env.reset(prompt)

    def step(self, prompt: Prompt, messages: list[dict], text: str) -> tuple[list[dict], bool, float]:
        return self.env.step(messages, text)


def make_episode_env(env: EnvSpec, task: Task, tokenizer=None):
    """The episode env for the ``env`` block (``env.task`` / ``env.turns``)."""
    if env.task == "tool_calc":
        return ToolEpisodes(env.turns)
    if env.turns != 1:
        raise ValueError(f"env.turns: task {env.task!r} is single-turn; set env.turns: 1")
    return SingleTurnEpisodes(task)
