"""Harness rollout requests <-> SGLang ``Engine.generate`` inputs and outputs (pure, no engine).

Request (harness/rollout/requests.py): ``{request_id, prompt_ids, max_new_tokens, seed,
temperature, top_p}``. For SGLang:

* ``input_ids``: the prompt ids (the engine runs with ``skip_tokenizer_init=True``);
* ``sampling_params``: ``temperature``, ``top_p``, ``sampling_seed`` (per request),
  ``max_new_tokens = min(max_new_tokens, max_position - len(prompt_ids))`` (the native
  engine's stopping rule), ``stop_token_ids=[eos]`` and ``ignore_eos=False``: SGLang's
  token-based finish check returns at once when ``ignore_eos`` is set, stop ids included
  (measured on an H100: with it set, a request of the medium model went on past its EOS
  where the native engine stopped); with no tokenizer loaded the stop ids and the model
  config's ``eos_token_id`` (the same id, ``hf_dir``) are all it checks.
  ``skip_special_tokens=False``, ``no_stop_trim=True`` (the EOS stays the last output
  token, as natively);
* ``return_logprob=True``: only the output tokens' logprobs are read
  (``meta_info["output_token_logprobs"]``, ``(logprob, token_id, text)`` entries).

Result: ``{request_id, prompt_ids, output_ids, logprobs, finish_reason: eos|length,
weight_version}`` (``make_result``); SGLang's ``finish_reason.type`` ``stop`` becomes
``eos`` (checked: the last token is the EOS), ``length`` stays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.rollout.requests import make_result


def sampling_params(request: Mapping[str, Any], *, eos_token_id: int | None, max_position: int) -> dict[str, Any]:
    """SGLang's ``sampling_params`` dict for one request."""
    max_new = min(int(request["max_new_tokens"]), max_position - len(request["prompt_ids"]))
    return {
        "temperature": float(request["temperature"]),
        "top_p": float(request["top_p"]),
        "sampling_seed": int(request["seed"]),
        "max_new_tokens": max_new,
        "stop_token_ids": [] if eos_token_id is None else [int(eos_token_id)],
        "ignore_eos": False,  # True would skip the stop ids too (module docstring)
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }


def generate_kwargs(requests: Sequence[Mapping[str, Any]], *, eos_token_id: int | None,
                    max_position: int) -> dict[str, Any]:
    """Keyword arguments of ``sglang.Engine.generate`` for a batch (one entry per request)."""
    return {
        "input_ids": [[int(t) for t in r["prompt_ids"]] for r in requests],
        "sampling_params": [sampling_params(r, eos_token_id=eos_token_id, max_position=max_position)
                            for r in requests],
        "return_logprob": True,
    }


def result_of(request: Mapping[str, Any], out: Mapping[str, Any], *, eos_token_id: int | None,
              weight_version: int) -> dict:
    """The harness result dict from one SGLang output (``output_ids`` + ``meta_info``)."""
    rid = request["request_id"]
    output_ids = [int(t) for t in out.get("output_ids", [])]
    meta = out.get("meta_info") or {}
    lps = meta.get("output_token_logprobs")
    if lps is None or len(lps) != len(output_ids):
        raise RuntimeError(f"SGLang returned no per-token logprobs for request {rid!r}")
    logprobs = [float(entry[0]) for entry in lps]  # (logprob, token_id, text)
    if [int(entry[1]) for entry in lps] != output_ids:
        raise RuntimeError(f"SGLang's logprob tokens differ from its output ids for request {rid!r}")
    reason = (meta.get("finish_reason") or {}).get("type")
    if reason == "stop":
        if eos_token_id is None or not output_ids or output_ids[-1] != int(eos_token_id):
            raise RuntimeError(f"SGLang stopped request {rid!r} not on EOS: {meta.get('finish_reason')!r}")
        finish = "eos"
    elif reason == "length":
        finish = "length"
    else:
        raise RuntimeError(f"SGLang finished request {rid!r} with {reason!r} (expected stop or length)")
    return make_result(request, output_ids, logprobs, finish, weight_version)
