"""Request and result dicts of the rollout interface (docs/design.md, "Rollout").

Request: ``{request_id, prompt_ids, max_new_tokens, seed, temperature, top_p, capture?}``.
Result:  ``{request_id, prompt_ids, output_ids, logprobs, finish_reason, weight_version, capture?}``
with ``finish_reason`` ``"eos"`` (the EOS token is the last output token and
is included) or ``"length"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REQUIRED_FIELDS = ("request_id", "prompt_ids", "max_new_tokens", "seed", "temperature", "top_p")


def validate_request(request: Mapping[str, Any], *, vocab: int, max_position: int) -> None:
    """Raise ValueError naming the request and the field for any malformed request."""
    if not isinstance(request, Mapping):
        raise ValueError(f"rollout request must be a dict, got {type(request).__name__}")
    rid = request.get("request_id", "<no request_id>")
    missing = [f for f in REQUIRED_FIELDS if f not in request]
    if missing:
        raise ValueError(f"rollout request {rid!r} is missing field(s): {', '.join(missing)}")
    prompt = request["prompt_ids"]
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ValueError(f"rollout request {rid!r}: prompt_ids must be a non-empty list of ints")
    for tok in prompt:
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < vocab:
            raise ValueError(f"rollout request {rid!r}: prompt_ids holds {tok!r}, outside [0, {vocab})")
    if len(prompt) >= max_position:
        raise ValueError(
            f"rollout request {rid!r}: prompt_ids has {len(prompt)} tokens, model.max_position is {max_position}"
        )
    mnt = request["max_new_tokens"]
    if isinstance(mnt, bool) or not isinstance(mnt, int) or mnt < 0:
        raise ValueError(f"rollout request {rid!r}: max_new_tokens must be an int >= 0, got {mnt!r}")
    seed = request["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"rollout request {rid!r}: seed must be an int >= 0, got {seed!r}")
    temp = request["temperature"]
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp < 0:
        raise ValueError(f"rollout request {rid!r}: temperature must be >= 0, got {temp!r}")
    top_p = request["top_p"]
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"rollout request {rid!r}: top_p must be in (0, 1], got {top_p!r}")


def make_result(
    request: Mapping[str, Any], output_ids: list[int], logprobs: list[float], finish_reason: str, weight_version: int
) -> dict[str, Any]:
    result = {
        "request_id": request["request_id"],
        "prompt_ids": list(request["prompt_ids"]),
        "output_ids": list(output_ids),
        "logprobs": list(logprobs),
        "finish_reason": finish_reason,
        "weight_version": int(weight_version),
    }
    if request.get("capture") is not None:
        result["capture"] = request["capture"]
    return result
