"""Environments: tokenizer + chat template, single-turn tasks, the multi-turn tool env.

Workload half only in spirit, but nothing here imports torch or ray (jinja2
is the one extra dependency, for the chat template). See docs/envs.md.
"""

from harness.envs.tasks import TASKS, Prompt, PromptLoader, Task, make_task, visible_text
from harness.envs.tokenizer import Tokenizer, load_tokenizer
from harness.envs.tool_env import ToolCalcEnv, evaluate

__all__ = [
    "TASKS",
    "Prompt",
    "PromptLoader",
    "Task",
    "Tokenizer",
    "ToolCalcEnv",
    "evaluate",
    "load_tokenizer",
    "make_task",
    "visible_text",
]
