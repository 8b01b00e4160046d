"""Tasks: determinism, rewards, the prompt loader's resume contract."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.envs.tasks import TASKS, Prompt, PromptLoader, make_task, visible_text
from harness.envs.tokenizer import load_tokenizer


@pytest.mark.parametrize("name", sorted(TASKS))
def test_prompts_are_a_function_of_seed_step_index(name):
    task = make_task(name, 7)
    assert task.prompts(3, 5) == make_task(name, 7).prompts(3, 5)
    assert task.prompts(3, 5)[2] == task.prompt(3, 2)
    assert task.prompts(3, 5) != task.prompts(4, 5)
    assert task.prompts(3, 8) != make_task(name, 8).prompts(3, 8)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_reference_answer_earns_full_reward_and_garbage_little(name):
    task = make_task(name, 1)
    for prompt in task.prompts(0, 8):
        assert task.reward(prompt, prompt.answer) == 1.0
        assert task.reward(prompt, f"<think>hmm</think>  {prompt.answer}<|im_end|>") == 1.0
        assert task.reward(prompt, "") == 0.0
        assert 0.0 <= task.reward(prompt, "<|reserved_200|>~~~") < 0.5


def test_prompts_identical_in_a_fresh_interpreter():
    code = "from harness.envs.tasks import make_task; print([p.text for p in make_task('arith', 5).prompts(2, 6)])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str([p.text for p in make_task("arith", 5).prompts(2, 6)])


def test_arith_partial_credit_orders_near_misses():
    task = make_task("arith", 0)
    prompt = Prompt(task="arith", step=0, index=0, text="3+4=", answer="7")
    assert task.reward(prompt, "7") == 1.0
    assert task.reward(prompt, "7abc") == 1.0
    near, far = task.reward(prompt, "6"), task.reward(prompt, "A")
    assert 0.0 < far < near < 0.5
    assert task.reward(prompt, "~") == 0.0  # beyond the near-miss width


def test_copy_and_reverse_prefix_credit():
    copy = make_task("copy", 0)
    prompt = Prompt(task="copy", step=0, index=0, text="copy abc=", answer="abc")
    assert copy.reward(prompt, "abc") == 1.0
    assert copy.reward(prompt, "abX") == pytest.approx((2 + 0.5 * (1 - abs(ord("X") - ord("c")) / 64)) / 3)
    reverse = make_task("reverse", 0)
    rprompt = reverse.prompt(0, 0)
    assert rprompt.answer == rprompt.text.split(" ")[1].rstrip("=")[::-1]


def test_visible_text_drops_think_tool_calls_and_control_tokens():
    assert visible_text("<think>x</think> <|reserved_99|><tool_call>1+1</tool_call> 42") == "42"
    assert visible_text("<think>unterminated") == ""


def test_prompt_fits_the_default_token_budget():
    tok = load_tokenizer()
    for name in TASKS:
        for prompt in make_task(name, 0).prompts(0, 16):
            ids = tok.apply_chat_template(prompt.messages, add_generation_prompt=True)
            assert len(ids) + 16 <= 64, (name, prompt.text)  # seq_len 64, max_new_tokens 16


def test_reward_refuses_a_prompt_of_another_task():
    with pytest.raises(ValueError, match="belongs to task 'copy'"):
        make_task("arith", 0).reward(make_task("copy", 0).prompt(0, 0), "x")


def test_make_task_errors_name_the_field():
    with pytest.raises(ValueError, match="env.task"):
        make_task("chess", 0)


def test_prompt_dict_round_trip():
    prompt = make_task("parity", 3).prompt(1, 2)
    assert Prompt.from_dict(prompt.to_dict()) == prompt
    assert prompt.uid == "parity/step1/2"


def test_loader_resume_continues_identically():
    task = make_task("arith", 11)
    straight = PromptLoader(task, 4)
    expected = [straight.next_batch() for _ in range(5)]
    first = PromptLoader(task, 4)
    got = [first.next_batch() for _ in range(2)]
    state = first.state_dict()
    resumed = PromptLoader(task, 4)
    resumed.load_state_dict(state)
    got += [resumed.next_batch() for _ in range(3)]
    assert got == expected
    assert resumed.state_dict()["step"] == 5


def test_loader_seed_override_and_state_mismatch_errors():
    task = make_task("arith", 11)
    assert PromptLoader(task, 4, seed=99).next_batch() == task.prompts(0, 4, seed=99)
    loader = PromptLoader(task, 4)
    with pytest.raises(ValueError, match="'prompts_per_step'"):
        loader.load_state_dict(dict(PromptLoader(task, 8).state_dict()))
    with pytest.raises(ValueError, match="'task'"):
        loader.load_state_dict(PromptLoader(make_task("copy", 11), 4).state_dict())
    with pytest.raises(ValueError, match="missing 'step'"):
        loader.load_state_dict({"task": "arith", "seed": 11, "prompts_per_step": 4})
    with pytest.raises(ValueError, match="grpo.prompts_per_step"):
        PromptLoader(task, 0)
