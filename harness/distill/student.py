"""The student's side of distillation: teacher logits read from IPC, and the loss with the KL term.

A distillation train batch carries, besides the GRPO tensors, ``teacher_refs``:
one ``{"teacher_shards": [SampleRef per teacher TP rank]}`` per sample, in
batch order (``harness.distill.teacher``). It is a list, so DP sharding and
microbatching slice it like the tensors. :class:`TeacherReader` maps the
buffers the refs name (once per buffer, in the student's own process: shared
memory on CPU, CUDA IPC on GPU), concatenates a sample's vocab shards in TP
order into its ``[T, V]`` logits and turns them into the teacher's logprobs of
the sampled tokens (``harness.algos.distill.token_logprobs_from_logits``).

:class:`DistillLoss` is the GRPO loss (``ClippedPGLoss``) plus
``distill.kl_coef`` times the reverse-KL term (``harness.algos.distill``); its
metrics add ``distill_kl`` (the uncoefficiented term, a token mean) and its
``loss`` is the total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from harness.algos.distill import distill_kl_term, token_logprobs_from_logits
from harness.algos.loss import TOKENS, ClippedPGLoss
from harness.distill.teacher_ipc import TeacherHandle, read_sample
from harness.spec.typed import as_mapping

TEACHER_REFS = "teacher_refs"


class TeacherReader:
    """Teacher logits of a batch from its refs. Keeps one mapped buffer per teacher process (its
    latest: a teacher rank holds one buffer at a time, so a new handle of the same owner means
    its buffer grew and the old mapping is dropped)."""

    def __init__(self) -> None:
        self._opened: dict[TeacherHandle, torch.Tensor] = {}

    def logits(self, refs: Sequence[Mapping[str, Any]], device: torch.device | str = "cpu") -> torch.Tensor:
        """``[B, T, V]`` logits (a copy) of the samples ``refs`` name."""
        if not refs:
            raise ValueError("teacher refs: empty batch")
        wanted = {s.handle for r in refs for s in r["teacher_shards"]}
        owners = {h.owner for h in wanted}
        for stale in [h for h in self._opened if h.owner in owners and h not in wanted]:
            del self._opened[stale]
        rows = [torch.cat([read_sample(s, self._opened) for s in r["teacher_shards"]], dim=-1) for r in refs]
        return torch.stack(rows).to(device)

    def logprobs(self, refs: Sequence[Mapping[str, Any]], input_ids: torch.Tensor, temperature: float) -> torch.Tensor:
        """``[B, S]`` teacher logprobs of ``input_ids`` (design alignment, column 0 = 0)."""
        logits = self.logits(refs, input_ids.device)
        if tuple(logits.shape[:2]) != tuple(input_ids.shape):
            raise ValueError(f"teacher logits {tuple(logits.shape)} do not cover input_ids {tuple(input_ids.shape)}")
        return token_logprobs_from_logits(logits, input_ids, temperature=temperature)


class DistillLoss:
    """``ClippedPGLoss(grpo.loss)`` + ``kl_coef * distill_kl``; same call contract as the GRPO loss."""

    def __init__(self, loss_cfg: Any, distill_cfg: Any) -> None:
        """``loss_cfg``: the ``grpo.loss`` block; ``distill_cfg``: the ``distill`` block (typed or a dict)."""
        distill_cfg = as_mapping(distill_cfg)
        self.pg = ClippedPGLoss(loss_cfg)
        if not self.pg.token_level_loss:
            raise ValueError("distillation needs grpo.loss.token_level_loss: true (the KL term is a token mean)")
        self.kl_coef = float(distill_cfg["kl_coef"])
        self.kl_type = str(distill_cfg["kl_type"])
        self.temperature = float(distill_cfg["temperature"])
        self.input_clamp = self.pg.kl_input_clamp
        self.output_clamp = self.pg.kl_output_clamp
        self.metric_normalizations = {**self.pg.metric_normalizations, "distill_kl": TOKENS}
        self.reader = TeacherReader()

    def teacher_logprobs(self, data: Mapping[str, Any]) -> torch.Tensor:
        if TEACHER_REFS not in data:
            raise ValueError(f"distillation loss data is missing {TEACHER_REFS!r} (the teacher's logits refs)")
        return self.reader.logprobs(data[TEACHER_REFS], data["input_ids"], self.temperature)

    def __call__(self, curr_logprobs: torch.Tensor, data: Mapping[str, Any],
                 global_valid_seqs: torch.Tensor | float,
                 global_valid_toks: torch.Tensor | float) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = self.pg(curr_logprobs, data, global_valid_seqs, global_valid_toks)
        with torch.no_grad():
            teacher = self.teacher_logprobs(data).to(curr_logprobs.dtype)
        term = distill_kl_term(curr_logprobs, teacher, data["token_mask"], data["sample_mask"], global_valid_toks,
                               kl_type=self.kl_type, input_clamp=self.input_clamp, output_clamp=self.output_clamp)
        total = loss + self.kl_coef * term
        metrics["loss"] = float(total.detach())
        metrics["distill_kl"] = float(term.detach())
        return total, metrics

