"""CUDA graphs of the invariant decode step (``Engine(cuda_graphs=True)``, cuda, TP 1).

A decode-only step on the invariant kernels (``decode_invariant``) launches a few
thousand small kernels; at decode's few rows the launches, not the GPU, set its time.
``DecodeGraphs`` records that step once per *bucket* and replays it:

* rows: the step's rows padded to ``bucket_rows(n)`` (the next power of two, at most
  ``max_batch_size``) with *padding rows* on a scratch KV slot the scheduler never
  hands out (slot ``max_batch_size``; padding row ``j`` writes and reads position ``j``
  of it and nothing else). The invariant kernels compute every row on its own (no
  reduction runs across rows), so a row's bits do not depend on the padding rows;
* cache length: the batch's longest cache padded to ``bucket_length`` (a power of two,
  at most ``max_position``). The invariant attention already pads every row to the
  batch's longest cache and masks it to its own length, and its folds are blind to
  extra zero padding (``invariant.fold_sum``), so a longer masked length gives the
  same bits.

So a replayed step gives every row the bits the eager step gives it, and the same
bits as the row alone (the invariant guarantee). That is also checked: the first use
of every bucket runs the step eagerly (the capture's warm-up), then replays the new
graph on the same inputs and requires equal logits (``torch.equal``), else a
``RuntimeError`` naming the bucket (no silent fallback). Replays write the same KV
rows with the same values as the eager step, so the check's second run changes nothing.

The graphs read the engine's weights, KV cache and RoPE tables where they lie: a
refit copies into the same tensors (``PackedWeights.load``), so the graphs stay valid.
All buckets share one memory pool; a replay's logits are copied out before the next
replay (the scheduler samples on the host). A replayed step dispatches no ATen
operators, so a rollout profiler counts only the few around the replay (the inputs
copied in, the logits copied out): engines with graphs have operator inventories of
their own. On by default on cuda at TP 1 (``engine.default_cuda_graphs``); the cuda
goldens were refreshed with them (issue 20).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from harness.rollout.native.decode_batch import DecodeBatch, DecodeRow
from harness.rollout.native.forward import Forward
from harness.rollout.native.invariant import next_pow2

GRAPHS_ENV = "HARNESS_NATIVE_CUDA_GRAPHS"
MIN_LENGTH = 16  # the shortest length bucket


def graphs_unavailable(fwd: Forward) -> str | None:
    """Why this engine's decode cannot run as CUDA graphs, or None."""
    if fwd.device.type != "cuda":
        return f"device {fwd.device} is not cuda"
    if fwd.kernels != "invariant":
        return "the decode kernels are not the invariant ones"
    if fwd.plan.tp_size != 1:
        return f"tp_size {fwd.plan.tp_size} > 1 (a step's collectives cannot be captured)"
    return None


def padded_inputs(seqs: Sequence[DecodeRow], rows: int, scratch_slot: int) -> torch.Tensor:
    """Host ``[3, rows]`` int64 (positions, slots, new tokens) of ``seqs`` (in this order)
    followed by ``rows - len(seqs)`` padding rows: padding row ``j`` at position ``j`` of
    ``scratch_slot``, token 0."""
    pad = rows - len(seqs)
    return torch.tensor([[s.cached for s in seqs] + list(range(pad)),
                         [s.slot for s in seqs] + [scratch_slot] * pad,
                         [s.tokens[-1] for s in seqs] + [0] * pad])


def padded_step(fwd: Forward, inputs: torch.Tensor, length: int) -> torch.Tensor:
    """The decode-only step on the invariant kernels over ``inputs`` (``padded_inputs``, on the
    device) with every row's attention over ``length`` cached positions (masked to its own):
    ``[rows, V]`` logits. What a graph records; eager, it is the unpadded step's rows."""
    positions, slots, tokens = inputs.unbind(0)
    dec = DecodeBatch(seqs=[], tokens=tokens, kv_rows=fwd.kv.row_index(slots, positions),
                      cos=fwd.rope_cos[positions].unsqueeze(1),
                      sin_signed=fwd.rope_sin_signed[positions].unsqueeze(1), groups=[], group_heads=[],
                      slots=slots, lengths=positions + 1, max_length=length)
    logits, _ = fwd.step([], dec)
    return logits


class _Bucket:
    """One captured step: its static inputs ``[3, rows]`` (positions, slots, tokens), graph, logits."""

    def __init__(self, inputs: torch.Tensor, graph: Any, logits: torch.Tensor) -> None:
        self.inputs, self.graph, self.logits = inputs, graph, logits


class DecodeGraphs:
    """The captured decode steps of one engine's ``Forward`` (see the module docstring).
    ``scratch_slot``: a KV slot reserved for padding rows (never allocated to a request)."""

    def __init__(self, fwd: Forward, max_batch_size: int, scratch_slot: int) -> None:
        problem = graphs_unavailable(fwd)
        if problem is not None:
            raise ValueError(f"cuda_graphs: {problem}")
        self.fwd, self.max_batch_size, self.scratch_slot = fwd, max_batch_size, scratch_slot
        self.buckets: dict[tuple[int, int], _Bucket] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.replays = 0

    def bucket_rows(self, n: int) -> int:
        return min(next_pow2(n), self.max_batch_size)

    def bucket_length(self, longest: int, rows: int) -> int:
        return min(max(next_pow2(longest), next_pow2(rows), MIN_LENGTH), self.fwd.cfg.max_position)

    def _capture(self, key: tuple[int, int], host: torch.Tensor) -> _Bucket:
        inputs = host.to(self.fwd.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            eager = padded_step(self.fwd, inputs, key[1])  # the warm-up, and the reference of the check below
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = padded_step(self.fwd, inputs, key[1])
        bucket = _Bucket(inputs, graph, logits)
        graph.replay()
        if not torch.equal(logits, eager):
            raise RuntimeError(f"cuda_graphs: the replayed decode step of bucket (rows {key[0]}, length {key[1]}) "
                               "differs from the eager step")
        return bucket

    def decode(self, seqs: Sequence[DecodeRow]) -> tuple[list[DecodeRow], torch.Tensor]:
        """One decode step for ``seqs`` (at most ``max_batch_size`` rows, one new token each):
        the rows in ``DecodeBatch`` order and their logits ``[n, V]`` (a copy)."""
        ordered = sorted(seqs, key=lambda s: s.cached)
        for s in ordered:
            if len(s.tokens) - s.cached != 1:
                raise AssertionError("batched decode rows carry exactly one new token")
            if s.cached >= self.fwd.cfg.max_position:
                raise RuntimeError(
                    f"sequence length {s.cached + 1} exceeds model.max_position ({self.fwd.cfg.max_position})"
                )
        rows = self.bucket_rows(len(ordered))
        key = (rows, self.bucket_length(ordered[-1].cached + 1, rows))
        host = padded_inputs(ordered, rows, self.scratch_slot)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = self._capture(key, host)
        else:
            bucket.inputs.copy_(host)
            bucket.graph.replay()
        self.replays += 1
        return ordered, bucket.logits[: len(ordered)].clone()
