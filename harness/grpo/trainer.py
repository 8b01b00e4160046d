"""The GRPO step shared by all trainers.

One step: (attempts of) rollouts -> rewards -> samples -> policy and reference
logprobs -> advantages -> train -> refit. The trainers differ only in how the
train batch travels and how training is driven:

* ``sync``       data passed directly, monolithic ``train`` ("legacy");
* ``dataplane``  bulk tensors staged in the durable data plane, only keys
                 passed to the policy ("TransferQueue");
* ``streaming``  prompt groups fed to the split train API as they are ready.

Every rollout attempt is wrapped in the rollout profiler window
``step{N}/attempt{M}`` on every rollout worker; a failing attempt is aborted
with reason ``grpo_rollout_error`` and the original error re-raised.

Fail closed on empty training: a step whose samples passed capture
verification fewer than ``grpo.min_verified_samples`` times (absent: 1) raises
:class:`EmptyTrainingStep` before anything is trained, naming the step and
what masked the rest; the runner records it and the run ends as failed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from harness.algos import compute_advantages, expand_to_tokens, reward_metrics, rollout_metrics
from harness.capture.finalize import Placeholder, Sample, mask_cause
from harness.grpo.batch import build_train_batch, prompt_rows
from harness.grpo.rollouts import AttemptResult, RolloutDriver
from harness.spec.typed import Workload


class EmptyTrainingStep(RuntimeError):
    """A step had fewer verified samples than ``grpo.min_verified_samples``."""


def min_verified_samples(spec: Workload) -> int:
    """``grpo.min_verified_samples``; 1 when absent (the schema writes no default into a
    loaded spec, so the digests of specs that do not set it stay what they were)."""
    minimum = spec.grpo.min_verified_samples
    return 1 if minimum is None else minimum


def check_verified(step: int, samples: list[Sample | Placeholder], minimum: int) -> None:
    """Raise :class:`EmptyTrainingStep` when fewer than ``minimum`` of the step's
    samples are verified (not masked). The message names the step, the counts,
    the threshold and how many rollouts each cause masked (``mask_cause``),
    with one rollout id per cause."""
    verified = sum(1 for s in samples if not s.masked)
    if verified >= minimum:
        return
    causes: dict[str, list[str]] = {}
    for s in samples:
        if s.masked:
            causes.setdefault(mask_cause(s.reason), []).append(s.rollout_id)
    ranked = sorted(causes.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    masked = "; ".join(f"{len(ids)} by {cause}, e.g. {ids[0]}" for cause, ids in ranked) or "none"
    raise EmptyTrainingStep(
        f"step {step}: {verified} of {len(samples)} samples verified, fewer than "
        f"grpo.min_verified_samples = {minimum}: the step is not trained and the run fails. Masked: {masked}"
    )


@dataclass
class StepOutput:
    step: int
    metrics: dict[str, float]
    timings: dict[str, float]
    summaries: list[dict] = field(default_factory=list)


class Trainer:
    """Owns the step loop; subclasses implement :meth:`train_phase`."""

    name = "base"

    def __init__(self, spec: Workload, policy, workers: list, driver: RolloutDriver, loader, tokenizer,
                 env, refit: Callable[[int], dict], dataplane=None) -> None:
        self.spec = spec  # the plan's typed workload
        self.policy = policy
        self.workers = workers
        self.driver = driver
        self.loader = loader
        self.tokenizer = tokenizer
        self.env = env
        self.refit = refit
        self.dataplane = dataplane
        self.G = spec.grpo.generations_per_prompt
        self.seq_len = spec.policy.seq_len

    # -- rollouts ---------------------------------------------------------
    @contextlib.contextmanager
    def rollout_window(self, step_id: str):
        ray.get([w.begin_rollout.remote(step_id) for w in self.workers])
        try:
            yield
        except BaseException as exc:
            try:
                ray.get([w.abort_rollout.remote("grpo_rollout_error") for w in self.workers])
            except Exception as abort_exc:  # noqa: BLE001 - never mask the original error
                exc.add_note(f"abort_rollout also failed: {abort_exc!r}")
            raise
        ray.get([w.finish_rollout.remote() for w in self.workers])

    def rollouts(self, step: int, prompts: list) -> tuple[AttemptResult, int]:
        g = self.spec.grpo
        attempts = g.max_attempts if g.dynamic_sampling else 1
        result = None
        for attempt in range(1, attempts + 1):
            with self.rollout_window(f"step{step}/attempt{attempt}"):
                result = self.driver.run_attempt(prompts, step, attempt)
            if _has_signal(result.rewards, self.G):
                break
        return result, attempt

    # -- one step ----------------------------------------------------------
    def step(self, step: int) -> StepOutput:
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        prompts = self.loader.next_batch()
        result, attempts = _timed(timings, "generation", lambda: self.rollouts(step, prompts))
        check_verified(step, result.samples, min_verified_samples(self.spec))
        pad = int(self.tokenizer.pad_token_id)
        batch = build_train_batch(result.samples, seq_len=self.seq_len, pad_token_id=pad)
        rows = prompt_rows(
            [self.tokenizer.apply_chat_template(self.env.reset(p), add_generation_prompt=True) for p in prompts],
            self.G, pad,
        )
        rewards = torch.tensor(result.rewards, dtype=torch.float32)
        g = self.spec.grpo
        loo = g.leave_one_out
        adv = compute_advantages(rows, rewards, leave_one_out=loo, normalize=g.normalize_rewards,
                                 valid_mask=batch["sample_mask"] > 0)
        batch["advantages"] = expand_to_tokens(adv, batch["token_mask"])
        train_metrics = _timed(timings, "policy_training", lambda: self.train_phase(step, batch, timings))
        refit = _timed(timings, "refit", lambda: self.refit(step))
        for key, value in ((refit or {}).get("phases") or {}).items():  # the refit's sub-phases (informational)
            timings[f"refit/{key}"] = float(value)
        timings["total_step_time"] = time.perf_counter() - t0
        metrics = dict(train_metrics)
        metrics.update(result.metrics)
        metrics.update(reward_metrics(rows, rewards, adv, batch["token_mask"], leave_one_out=loo))
        metrics.update(_length_metrics(result.summaries, self.spec.env.turns))
        metrics["dynamic_sampling_num_gen_batches"] = float(attempts)
        return StepOutput(step, metrics, timings, result.summaries)

    def logprobs(self, batch: dict, timings: dict) -> None:
        """Fill ``prev_logprobs`` and ``reference_policy_logprobs`` in place."""
        t = time.perf_counter()
        batch["prev_logprobs"] = self.policy.get_logprobs(batch)
        batch["reference_policy_logprobs"] = self.policy.get_reference_logprobs(batch)
        timings["policy_and_reference_logprobs"] = time.perf_counter() - t

    def train_phase(self, step: int, batch: dict, timings: dict) -> dict[str, float]:
        raise NotImplementedError


def _timed(timings: dict, name: str, fn: Callable[[], Any]) -> Any:
    t = time.perf_counter()
    try:
        return fn()
    finally:
        timings[name] = time.perf_counter() - t


def _has_signal(rewards: list[float], G: int) -> bool:
    """True when some prompt group has rewards that differ (non-zero std)."""
    return any(len(set(rewards[i : i + G])) > 1 for i in range(0, len(rewards), G))


def _length_metrics(summaries: list[dict], max_turns: int) -> dict[str, float]:
    """Length/termination metrics over the rollouts that reached the engine."""
    ran = [s for s in summaries if s["calls"]]
    return rollout_metrics(
        prompt_lengths=[s["calls"][0]["prompt_tokens"] for s in ran],
        gen_lengths=[sum(c["output_tokens"] for c in s["calls"]) for s in ran],
        finish_reasons=[s["calls"][-1]["finish_reason"] for s in ran],
        turns=[s["turns"] for s in ran],
        max_turns=max_turns,
    )
