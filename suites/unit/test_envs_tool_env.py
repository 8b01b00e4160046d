"""The multi-turn `tool_calc` environment: episodes, robustness, determinism."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.envs.tasks import make_task
from harness.envs.tokenizer import load_tokenizer
from harness.envs.tool_env import CalcError, ToolCalcEnv, evaluate, tool_reply

TOK = load_tokenizer()


def test_episode_tool_call_then_answer():
    env = ToolCalcEnv(turns=3)
    prompt = make_task("tool_calc", 0).prompt(0, 0)
    messages = env.reset(prompt)
    expression = prompt.text.removeprefix("Compute: ")
    messages, done, reward = env.step(messages, f"<tool_call>{expression}</tool_call>")
    assert not done and reward == 0.0
    assert messages[-1] == {"role": "tool", "content": prompt.answer}
    messages, done, reward = env.step(messages, f"It is {prompt.answer}.")
    assert done and reward == 1.0
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]


def test_turn_budget_ends_the_episode():
    env = ToolCalcEnv(turns=2)
    messages = env.reset("Compute: 2*3+1")
    messages, done, _ = env.step(messages, "<tool_call>2*3</tool_call>")
    assert not done
    messages, done, reward = env.step(messages, "<tool_call>6+1</tool_call>")
    assert done and reward == 0.0  # budget spent: the call is not answered
    assert messages[-1]["role"] == "assistant"
    single = ToolCalcEnv(turns=1)
    _, done, reward = single.step(single.reset("Compute: 2*3+1"), "7")
    assert done and reward == 1.0


def test_step_does_not_mutate_its_input():
    env = ToolCalcEnv(turns=3)
    messages = env.reset("Compute: 1+1")
    snapshot = [dict(m) for m in messages]
    env.step(messages, "<tool_call>1+1</tool_call>")
    assert messages == snapshot


@pytest.mark.parametrize(
    ("expression", "expected"),
    [("2+3*4", 14), ("(2+3)*4", 20), ("-(-3)", 3), (" 7 - 10 ", -3), ("0*999999", 0)],
)
def test_calculator_values(expression, expected):
    assert evaluate(expression) == expected


@pytest.mark.parametrize(
    ("expression", "reason"),
    [("", "empty"), ("2**3", "unexpected"), ("1/0", "unexpected"), ("(1", "missing"),
     ("9999999", "too long"), ("999999*999999*999999", "overflow"), ("(" * 12 + "1" + ")" * 12, "nesting"),
     ("1+" * 40 + "1", "too long"), ("__import__('os')", "unexpected")],
)
def test_calculator_refusals_become_error_replies(expression, reason):
    with pytest.raises(CalcError, match=reason):
        evaluate(expression)
    assert tool_reply(f"<tool_call>{expression}</tool_call>").startswith("error: ")


@given(st.lists(st.integers(0, 255), max_size=48), st.integers(1, 4))
def test_any_model_output_is_handled(ids, turns):
    env = ToolCalcEnv(turns=turns)
    messages = env.reset("Compute: 3*4+5")
    text = TOK.decode(ids)
    new_messages, done, reward = env.step(messages, text)
    assert 0.0 <= reward <= 1.0
    assert new_messages[len(messages)] == {"role": "assistant", "content": text}
    # The chat template renders every state the env produces.
    TOK.apply_chat_template(new_messages, add_generation_prompt=not done)


def test_random_episodes_replay_identically():
    def play(seed: int) -> list:
        rng = random.Random(seed)
        env = ToolCalcEnv(turns=3)
        log = []
        for prompt in make_task("tool_calc", seed).prompts(0, 4):
            messages, done = env.reset(prompt), False
            while not done:
                choice = rng.choice(["<tool_call>2*3+1</tool_call>", "<tool_call>x</tool_call>", prompt.answer, "??"])
                messages, done, reward = env.step(messages, choice)
            log.append((messages, reward))
        return log

    assert play(3) == play(3)


def test_bad_prompts_and_config():
    with pytest.raises(ValueError, match="Compute"):
        ToolCalcEnv().reset("hello")
    with pytest.raises(ValueError, match="env.turns"):
        ToolCalcEnv(turns=0)
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        ToolCalcEnv().step([{"role": "assistant", "content": "x"}], "1")


def test_tool_turn_render_keeps_the_eos_boundary_replace_prefix_tokens_uses():
    env = ToolCalcEnv(turns=3)
    call = "<tool_call>2*3+1</tool_call>"
    messages, _, _ = env.step(env.reset("Compute: 2*3+1"), call)
    # Template prefix = render through the last assistant message, no generation prompt.
    prefix = TOK.apply_chat_template(messages[:2], add_generation_prompt=False)
    full = TOK.apply_chat_template(messages, add_generation_prompt=True)
    k = prefix.count(TOK.eos_token_id)
    eos_positions = [i for i, t in enumerate(full) if t == TOK.eos_token_id]
    cut = eos_positions[k - 1]
    assert TOK.decode(full[:cut]).endswith("<|im_start|>assistant\n" + call)
    assert (
        TOK.decode(full[cut:])
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # As with Qwen3, the prefix render differs (the last assistant turn gets an
    # empty think block), so splicing must go by EOS count, not by position.
    assert full[: len(prefix)] != prefix
