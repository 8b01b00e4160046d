"""Harness rollout requests <-> vLLM inputs and outputs (pure, no engine).

Request (harness/rollout/requests.py): ``{request_id, prompt_ids, max_new_tokens,
seed, temperature, top_p, capture?}``. For vLLM:

* prompt: ``{"prompt_token_ids": prompt_ids}`` (no tokenizer in the engine);
* ``SamplingParams(n=1, temperature, top_p, seed, max_tokens, logprobs=0,
  stop_token_ids=[eos], ignore_eos=True, detokenize=False)``: per-request seed;
  ``logprobs=0`` returns exactly the sampled token's logprob; the engine is
  built with ``logprobs_mode="processed_logprobs"`` so that logprob is taken
  from the distribution the token was sampled from (after temperature and
  top-p), the native engine's convention (docs/rollout.md); EOS is an explicit
  stop token (``ignore_eos`` keeps vLLM from guessing one without a tokenizer);
* ``max_tokens = min(max_new_tokens, model.max_position - len(prompt_ids))``,
  the native engine's stopping rule.

Result: ``{request_id, prompt_ids, output_ids, logprobs, finish_reason:
eos|length, weight_version, capture?}`` (``make_result``); vLLM's ``stop``
becomes ``eos`` (the EOS token is the last output token, as natively).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.rollout.requests import make_result, validate_request


def sampling_kwargs(request: Mapping[str, Any], *, eos_token_id: int | None, max_position: int) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one request."""
    max_tokens = min(int(request["max_new_tokens"]), max_position - len(request["prompt_ids"]))
    return {
        "n": 1,
        "temperature": float(request["temperature"]),
        "top_p": float(request["top_p"]),
        "seed": int(request["seed"]),
        "max_tokens": max_tokens,
        "logprobs": 0,
        "stop_token_ids": [] if eos_token_id is None else [int(eos_token_id)],
        "ignore_eos": True,
        "detokenize": False,
    }


def prompt_of(request: Mapping[str, Any]) -> dict[str, list[int]]:
    return {"prompt_token_ids": [int(t) for t in request["prompt_ids"]]}


def check_requests(requests: list[Mapping[str, Any]], *, vocab: int, max_position: int) -> None:
    """The native engine's request validation (errors name the request and field)."""
    for request in requests:
        validate_request(request, vocab=vocab, max_position=max_position)


def result_of(request: Mapping[str, Any], completion: Any, *, eos_token_id: int | None, weight_version: int) -> dict:
    """The harness result dict from a vLLM ``CompletionOutput`` (token ids + sampled-token logprobs)."""
    rid = request["request_id"]
    output_ids = [int(t) for t in completion.token_ids]
    if completion.logprobs is None or len(completion.logprobs) != len(output_ids):
        raise RuntimeError(f"vLLM returned no per-token logprobs for request {rid!r}")
    logprobs = [float(step[tok].logprob) for step, tok in zip(completion.logprobs, output_ids)]
    reason = completion.finish_reason
    if reason == "stop":
        if eos_token_id is None or not output_ids or output_ids[-1] != int(eos_token_id):
            raise RuntimeError(f"vLLM stopped request {rid!r} on {completion.stop_reason!r}, not on EOS")
        finish = "eos"
    elif reason == "length":
        finish = "length"
    else:
        raise RuntimeError(f"vLLM finished request {rid!r} with {reason!r} (expected stop or length)")
    return make_result(request, output_ids, logprobs, finish, weight_version)


def empty_result(request: Mapping[str, Any], *, weight_version: int) -> dict:
    """``max_tokens == 0`` (vLLM needs >= 1): no tokens, ``length``, as the native engine."""
    return make_result(request, [], [], "length", weight_version)
