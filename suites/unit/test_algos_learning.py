"""End-to-end learning signal: GRPO math + tasks + tokenizer lift mean reward.

A small single-token policy (embedding mean -> MLP -> RMSNorm -> head, init
std 0.02 like the tiny Qwen3-MoE) is trained with the real `ClippedPGLoss`,
`compute_advantages` and task rewards, 4 prompts x 4 generations per step,
AdamW lr 1e-3 (the spec defaults). It stands in for the reference model only
to keep this test in the unit tier; the trainer suites run the real model.
Everything is seeded, so the reward curve is identical on every run.
"""

from __future__ import annotations

import pytest
import torch

from harness.algos import ClippedPGLoss, compute_advantages, expand_to_tokens, global_valid_counts
from harness.envs.tasks import PromptLoader, make_task
from harness.envs.tokenizer import load_tokenizer
from harness.spec.schema import section_defaults

LOSS_CFG = {**section_defaults("grpo.loss")}  # the spec's grpo.loss defaults


class FirstTokenPolicy(torch.nn.Module):
    def __init__(self, vocab: int = 256, hidden: int = 64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.SiLU())
        self.norm = torch.nn.RMSNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        for name, param in self.named_parameters():
            if not name.startswith("norm"):
                torch.nn.init.normal_(param, std=0.02)

    def forward(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of the first response token, [B, vocab]."""
        return self.head(self.norm(self.mlp(self.embed(prompt_ids).mean(1)))).log_softmax(-1)


def train(task_name: str, steps: int = 50, generations: int = 4) -> list[float]:
    torch.manual_seed(0)
    tokenizer = load_tokenizer()
    task = make_task(task_name, 0)
    loader = PromptLoader(task, 4)
    policy, reference = FirstTokenPolicy(), FirstTokenPolicy()
    reference.load_state_dict(policy.state_dict())
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3, weight_decay=0.0)
    loss_fn = ClippedPGLoss(LOSS_CFG)
    curve = []
    for step in range(steps):
        prompts = [p for p in loader.next_batch() for _ in range(generations)]
        rows = [tokenizer.apply_chat_template(p.messages, add_generation_prompt=True) for p in prompts]
        width = max(map(len, rows))
        prompt_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
        with torch.no_grad():
            logprobs = policy(prompt_ids)
            sampled = torch.multinomial(logprobs.exp(), 1, generator=torch.Generator().manual_seed(step))
            ref_logprobs = reference(prompt_ids).gather(1, sampled)
        rewards = torch.tensor([task.reward(p, tokenizer.decode(s)) for p, s in zip(prompts, sampled.tolist())])
        # [B, 2]: column 0 stands for the prompt, column 1 is the generated token.
        token_mask = torch.tensor([[0.0, 1.0]]).repeat(len(rows), 1)
        pad = torch.zeros(len(rows), 1)
        old = torch.cat([pad, logprobs.gather(1, sampled)], 1)
        data = {
            "advantages": expand_to_tokens(compute_advantages(prompt_ids, rewards), token_mask),
            "prev_logprobs": old,
            "generation_logprobs": old,
            "reference_policy_logprobs": torch.cat([pad, ref_logprobs], 1),
            "token_mask": token_mask,
            "sample_mask": torch.ones(len(rows)),
        }
        curr = torch.cat([pad, policy(prompt_ids).gather(1, sampled)], 1)
        loss, _ = loss_fn(curr, data, *global_valid_counts(data))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        curve.append(float(rewards.mean()))
    return curve


@pytest.fixture(autouse=True)
def deterministic_torch():
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(deterministic)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("task_name", ["arith", "parity"])
def test_mean_reward_rises_over_fifty_steps(task_name):
    curve = train(task_name)
    first, last = sum(curve[:10]) / 10, sum(curve[-10:]) / 10
    assert last > first + 0.05, (first, last)


def test_training_is_bit_reproducible():
    assert train("arith", steps=8) == train("arith", steps=8)
