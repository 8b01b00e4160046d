"""Continuous batching for the native engine: admission, one step at a time, sampling.

Requests are admitted in order while KV slots are free; each step prefills the
newly admitted requests and decodes one token for the running ones; a finished
request frees its slot at once. Within a step the decoding rows go through the
batched path (when it is on and there are at least two), the rest run per
request (with the invariant decode kernels every decoding row goes batched, and the
decode rows are sampled on the host). Identical prompts admitted in one step (a GRPO group) are prefilled
once: the followers get a copy of the leader's KV prefix and sample from the
leader's logits with their own generators (the same computation on the same
tokens gives the same bits). Every request samples with its own
``torch.Generator`` seeded from its ``seed``, so its tokens depend only on its
seed and its logits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.model.config import ModelConfig
from harness.rollout.native.decode_graphs import DecodeGraphs
from harness.rollout.native.forward import DecodeBatch, Forward
from harness.rollout.native.kv_cache import KVCachePool
from harness.rollout.native.sampling import sample_rows, sample_token
from harness.rollout.requests import make_result, validate_request


@dataclass
class RunningRequest:
    """One running request: its slot, generator and what it produced so far."""

    request: Mapping[str, Any]
    slot: int
    generator: torch.Generator
    max_new: int
    tokens: list[int]
    temperature: float = 1.0
    top_p: float = 1.0
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cached: int = 0  # positions already in the KV cache
    finish_reason: str | None = None


class Scheduler:
    """Runs ``generate`` over ``fwd`` with ``max_batch_size`` KV slots of ``kv``.

    ``batched_decode``: whether decoding rows share one batched forward (the probe's
    verdict); ``batched_sampling``: whether their logits are sampled together
    (``sample_rows``) or row by row (``sample_token``, the same bits; where the probe
    found ``sample_rows`` inexact on this device). ``eos_token_id``: the stop token,
    or None (stop on length only).
    """

    def __init__(self, cfg: ModelConfig, fwd: Forward, kv: KVCachePool, *, max_batch_size: int,
                 eos_token_id: int | None, batched_decode: bool, batched_sampling: bool = True,
                 graphs: DecodeGraphs | None = None) -> None:
        self.cfg, self.fwd, self.kv = cfg, fwd, kv
        self.max_batch_size = max_batch_size
        self.eos_token_id = eos_token_id
        self.batched_decode = batched_decode
        self.batched_sampling = batched_sampling
        self.graphs = graphs  # decode-only steps replayed as CUDA graphs (``decode_graphs``), or None

    def _start(self, request: Mapping[str, Any]) -> RunningRequest:
        prompt = list(request["prompt_ids"])
        room = self.cfg.max_position - len(prompt)
        return RunningRequest(
            request=request,
            slot=self.kv.allocate(),
            generator=torch.Generator().manual_seed(int(request["seed"])),
            max_new=min(int(request["max_new_tokens"]), room),
            tokens=prompt,
            temperature=float(request["temperature"]),
            top_p=float(request["top_p"]),
        )

    def _record(self, seq: RunningRequest, token: int, logprob: float) -> None:
        seq.cached = len(seq.tokens)
        seq.tokens.append(token)
        seq.output_ids.append(token)
        seq.logprobs.append(logprob)
        if self.eos_token_id is not None and token == self.eos_token_id:
            seq.finish_reason = "eos"
        elif len(seq.output_ids) >= seq.max_new:
            seq.finish_reason = "length"

    def _advance(self, seq: RunningRequest, logits: torch.Tensor) -> None:
        token, logprob = sample_token(logits[-1], temperature=seq.temperature, top_p=seq.top_p, generator=seq.generator)
        self._record(seq, token, logprob)

    def _step(self, step: list[RunningRequest]) -> None:
        """Run one step for ``step`` (decoding rows and newly admitted prefills) and sample
        (the module docstring says which rows share a forward)."""
        decoding = [s for s in step if s.cached > 0] if self.batched_decode else []
        invariant = self.fwd.kernels == "invariant"
        if len(decoding) < 2 and not invariant:
            decoding = []  # a lone row gains nothing from the batched path (invariant: its only path)
        chosen = {id(s) for s in decoding}
        computed: list[RunningRequest] = []
        leaders: dict[tuple[int, ...], RunningRequest] = {}
        followers: dict[int, list[RunningRequest]] = {}
        for seq in step:
            if id(seq) in chosen:
                continue
            if seq.cached == 0:
                leader = leaders.setdefault(tuple(seq.tokens), seq)
                if leader is not seq:
                    followers.setdefault(id(leader), []).append(seq)
                    continue
            computed.append(seq)
        rows = [(s.slot, s.cached, s.tokens[s.cached :]) for s in computed]
        decode_seqs: list[Any] | None = None
        if decoding and not rows and self.graphs is not None:  # a decode-only step: replayed
            decode_seqs, decode_logits = self.graphs.decode(decoding)
            row_logits: list[torch.Tensor] = []
        else:
            decode = DecodeBatch.build(self.fwd, decoding) if decoding else None
            decode_logits, row_logits = self.fwd.step(rows, decode)
            decode_seqs = None if decode is None else decode.seqs
        if decode_seqs is not None and not self.batched_sampling:
            for i, seq in enumerate(decode_seqs):
                self._advance(seq, decode_logits[i : i + 1])
        elif decode_seqs is not None:
            seqs = decode_seqs
            if invariant and decode_logits.device.type != "cpu":
                decode_logits = decode_logits.cpu()  # sampled on the CPU kernels: batch-invariant there
            tokens, logprobs = sample_rows(
                decode_logits,
                temperatures=[s.temperature for s in seqs],
                top_ps=[s.top_p for s in seqs],
                generators=[s.generator for s in seqs],
            )
            for seq, token, logprob in zip(seqs, tokens, logprobs):
                self._record(seq, token, logprob)
        for seq, logits in zip(computed, row_logits):
            copies = followers.get(id(seq), [])
            if copies:
                self.kv.copy_prefix(seq.slot, [c.slot for c in copies], len(seq.tokens))
            for s in (seq, *copies):
                self._advance(s, logits)

    @torch.no_grad()
    def generate(self, requests: Sequence[Mapping[str, Any]], weight_version: int) -> list[dict[str, Any]]:
        """Generate for every request; results in request order, stamped ``weight_version``."""
        for request in requests:
            validate_request(request, vocab=self.cfg.vocab, max_position=self.cfg.max_position)
        ids = [r["request_id"] for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("rollout request_ids within one generate call must be unique")
        results: dict[int, dict[str, Any]] = {}
        waiting = list(enumerate(requests))
        running: list[tuple[int, RunningRequest]] = []
        while waiting or running:
            admitted: list[tuple[int, RunningRequest]] = []
            while waiting and len(running) + len(admitted) < self.max_batch_size:
                index, request = waiting.pop(0)
                if int(request["max_new_tokens"]) == 0:
                    results[index] = make_result(request, [], [], "length", weight_version)
                    continue
                admitted.append((index, self._start(request)))
            step = running + admitted
            if not step:
                continue
            self._step([seq for _, seq in step])
            running = []
            for index, seq in step:
                if seq.finish_reason is None:
                    running.append((index, seq))
                else:
                    self.kv.release(seq.slot)
                    results[index] = make_result(
                        seq.request, seq.output_ids, seq.logprobs, seq.finish_reason, weight_version
                    )
        return [results[i] for i in range(len(requests))]
