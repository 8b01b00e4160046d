"""One rollout attempt: prompts x generations through the engines, with capture.

The agent loop is turn-synchronous: at every turn the pending model calls of
all live episodes are sent together (a sync engine gets one ``generate`` batch
per engine, an async engine one ``generate_one`` call per request, all in
flight). Every request carries its own seed derived from (run seed, step,
attempt, sample, turn), so the tokens do not depend on batching, engine count
or completion order.

With capture on (the default for golden workloads) every model call is
admitted, staged durably by the engine owner and committed to the ledger; the
training sample is rebuilt from the verified staged rows (fail closed:
anything incomplete becomes a masked placeholder). With capture off only
single-turn episodes are allowed, and the sample is built from the engine
result directly.

Capture costs the driver a fixed number of store operations per turn and per
attempt, whatever the batch size: one ``admit_many`` per turn, and per attempt
one ``finalize_from_ledger`` (two ledger queries for the receipts, one row
fetch).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from harness.capture.admission import AdmissionRequest, AdmissionResult, CaptureAdmitter
from harness.capture.finalize import Placeholder, Sample, finalize_from_ledger


@dataclass
class Episode:
    """One generation of one prompt, walked turn by turn."""

    index: int                 # position in the step's P*G rows (group members contiguous)
    prompt: Any                # the task's prompt object
    rollout_id: str
    messages: list[dict]
    turn: int = 0
    done: bool = False
    reward: float = 0.0
    last_call_id: str | None = None
    failed: str | None = None  # capture failure reason (episode ends, sample masked)
    calls: list[dict] = field(default_factory=list)   # engine results (capture-off path)


@dataclass
class AttemptResult:
    """What one attempt produced: one sample (or placeholder) per row, in row order."""

    samples: list[Sample | Placeholder]
    rewards: list[float]
    summaries: list[dict]          # token-free per-rollout summaries (rollouts surface)
    metrics: dict[str, float]


def request_seed(seed: int, step: int, attempt: int, index: int, turn: int) -> int:
    """A 63-bit seed that is a pure function of the request's coordinates."""
    digest = hashlib.sha256(f"{seed}/{step}/{attempt}/{index}/{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


class RolloutDriver:
    """Runs attempts against a fixed set of rollout workers.

    ``env`` is an episode environment with ``reset(prompt) -> messages`` and
    ``step(prompt, messages, assistant_text) -> (messages, done, reward)``;
    ``capture`` is ``None`` or a ``(admitter, ledger, dataplane)`` triple.
    """

    def __init__(
        self,
        spec: Any,
        workers: list,
        tokenizer,
        env,
        capture: tuple | None,
        on_summary: Callable[[dict], None] | None = None,
    ) -> None:
        self.spec = spec  # the plan's typed workload
        self.workers = workers
        self.tokenizer = tokenizer
        self.env = env
        self.capture = capture
        self.is_async = spec.rollout.is_async
        self._wave = 0
        self.turns = spec.env.turns
        if capture is None and self.turns > 1:
            raise ValueError(
                "env.turns > 1 needs capture.enabled: true (multi-turn samples are only "
                "built from verified staged tokens)"
            )

    # -- one attempt -------------------------------------------------------
    def run_attempt(self, prompts: list, step: int, attempt: int) -> AttemptResult:
        G = self.spec.grpo.generations_per_prompt
        episodes = []
        for p_idx, prompt in enumerate(prompts):
            for g in range(G):
                index = p_idx * G + g
                rid = f"step{step:04d}-attempt{attempt}-row{index:04d}"
                episodes.append(Episode(index, prompt, rid, self.env.reset(prompt)))
        for _turn in range(self.turns):
            live = [e for e in episodes if not e.done]
            if not live:
                break
            requests = self._requests(live, step, attempt)
            sendable = [(e, r) for e, r in zip(live, requests) if r is not None]
            results = self._generate([r for _, r in sendable])
            for (episode, _), result in zip(sendable, results):
                self._advance(episode, result)
        return self._finalize(episodes)

    # -- requests ----------------------------------------------------------
    def _requests(self, episodes: list[Episode], step: int, attempt: int) -> list[dict | None]:
        """One request per live episode (None: its admission failed and it ended).

        With capture on, the whole turn is admitted with one
        ``admitter.admit_many`` (one parent query, one prefix fetch, one
        admission transaction), which gives exactly the admissions and failure
        rows of admitting the episodes one by one in this order."""
        prompts = []
        admissions: list[AdmissionRequest] = []
        for e in episodes:
            call_id = f"call{e.turn}"
            template_ids = self.tokenizer.apply_chat_template(e.messages, add_generation_prompt=True)
            prompts.append(list(template_ids))
            if self.capture is None:
                continue
            if e.last_call_id is None:
                admissions.append(AdmissionRequest.root(e.rollout_id, call_id, template_ids))
            else:
                template_prefix = self.tokenizer.apply_chat_template(
                    _up_to_last_assistant(e.messages), add_generation_prompt=False
                )
                admissions.append(AdmissionRequest.continuation(
                    e.rollout_id, call_id, e.last_call_id, template_prefix, template_ids))
        results: list[AdmissionResult | None] = [None] * len(episodes)
        if self.capture is not None:
            admitter: CaptureAdmitter = self.capture[0]
            results = list(admitter.admit_many(admissions))
        return [self._request(e, prompt, adm, step, attempt) for e, prompt, adm in zip(episodes, prompts, results)]

    def _request(self, episode: Episode, prompt_ids: list[int], adm: AdmissionResult | None,
                 step: int, attempt: int) -> dict | None:
        ro = self.spec.rollout
        call_id = f"call{episode.turn}"
        capture = None
        if adm is not None:
            if not adm.ok:
                episode.failed = adm.failure_reason or "admission_failed"
                episode.done = True
                return None
            capture = adm.admission.to_dict()
            prompt_ids = list(adm.prompt_ids)
        episode.last_call_id = call_id
        return {
            "request_id": f"{episode.rollout_id}/{call_id}",
            "prompt_ids": prompt_ids,
            "max_new_tokens": ro.max_new_tokens,
            "seed": request_seed(self.spec.seed, step, attempt, episode.index, episode.turn),
            "temperature": ro.temperature,
            "top_p": ro.top_p,
            "capture": capture,
        }

    def _generate(self, requests: list[dict]) -> list[dict]:
        """Send requests round-robin over engines; results come back in request order."""
        if not requests:
            return []
        n = len(self.workers)
        if self.is_async:
            # one wave per engine and turn: in flight together, scheduled deterministically
            self._wave += 1
            refs = []
            for i, r in enumerate(requests):
                engine = i % n
                size = len(range(engine, len(requests), n))
                wave = {"id": f"w{self._wave}-e{engine}", "size": size, "index": i // n}
                refs.append(self.workers[engine].generate_one.remote({**r, "wave": wave}))
            return ray.get(refs)
        shards = [requests[e::n] for e in range(n)]
        outs = ray.get([w.generate.remote(s) for w, s in zip(self.workers, shards) if s])
        results: list[dict] = [None] * len(requests)  # type: ignore[list-item]
        for e, out in enumerate(outs):
            for j, res in enumerate(out):
                results[e + j * n] = res
        return results

    def _advance(self, episode: Episode, result: dict) -> None:
        episode.calls.append(result)
        coords = result.get("capture")
        if coords is not None and coords.get("disposition") != "staged":
            episode.failed = coords.get("failure_reason") or "capture_failed"
        text = self.tokenizer.decode(result["output_ids"])
        episode.messages, done, reward = self.env.step(episode.prompt, episode.messages, text)
        episode.reward = float(reward)
        episode.turn += 1
        episode.done = done or episode.failed is not None or episode.turn >= self.turns

    # -- samples -----------------------------------------------------------
    def _finalize(self, episodes: list[Episode]) -> AttemptResult:
        rewards = [e.reward for e in episodes]
        if self.capture is None:
            samples = [_direct_sample(e) for e in episodes]
            metrics = {"finalize/rollouts": float(len(samples)), "finalize/masked_count": 0.0}
        else:
            _, ledger, dataplane = self.capture
            _, samples, metrics = finalize_from_ledger(
                [(e.rollout_id, e.reward, e.last_call_id) for e in episodes], ledger, dataplane)
        summaries = [_summary(e, s) for e, s in zip(episodes, samples)]
        return AttemptResult(samples, rewards, summaries, dict(metrics))


def _up_to_last_assistant(messages: list[dict]) -> list[dict]:
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[: last + 1]


def _direct_sample(episode: Episode) -> Sample:
    """Capture-off path (single turn): the engine result is the sample."""
    res = episode.calls[-1]
    prompt, out = list(res["prompt_ids"]), list(res["output_ids"])
    tokens = prompt + out
    logprobs = [0.0] * len(prompt) + [float(x) for x in res["logprobs"]]
    digest = hashlib.sha256(json.dumps([tokens, logprobs]).encode()).hexdigest()
    return Sample(
        rollout_id=episode.rollout_id,
        token_ids=tokens,
        loss_mask=[0] * len(prompt) + [1] * len(out),
        generation_logprobs=logprobs,
        prompt_len=len(prompt),
        reward=episode.reward,
        weight_epoch=int(res["weight_version"]),
        calls=["call0"],
        terminal_selection="declared",
        sample_digest=digest,
    )


def _summary(episode: Episode, sample: Sample | Placeholder) -> dict:
    """Token-free record of one rollout for the ``rollouts`` surface."""
    masked = isinstance(sample, Placeholder) or sample.sample_mask == 0.0
    summary = {
        "rollout_id": episode.rollout_id,
        "row": episode.index,
        "turns": episode.turn,
        "reward": episode.reward,
        "decision": "masked" if masked else "trained",
        "reason": getattr(sample, "reason", None),
        "terminal_selection": sample.terminal_selection,
        "weight_epoch": sample.weight_epoch,
        "sample_tokens": len(sample.token_ids),
        "trained_tokens": int(sum(sample.loss_mask)),
        "sample_digest": None if masked else sample.sample_digest,
        "calls": [
            {
                "prompt_tokens": len(c["prompt_ids"]),
                "output_tokens": len(c["output_ids"]),
                "finish_reason": c["finish_reason"],
                "weight_version": c["weight_version"],
                "chain_hash": (c.get("capture") or {}).get("chain_hash"),
                "disposition": (c.get("capture") or {}).get("disposition"),
            }
            for c in episode.calls
        ],
    }
    if episode.failed:
        summary["capture_failure"] = episode.failed
    return summary
