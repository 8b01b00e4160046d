"""Samples -> the train batch tensors of docs/design.md.

Invariants: rows keep the attempt's order (P prompts x G generations, group
members contiguous); a placeholder row is all padding with ``sample_mask`` 0
and ``token_mask`` 0, so it contributes nothing to loss or metrics but keeps
its group's size; a sample longer than ``policy.seq_len`` is an error, never
silently truncated.
"""

from __future__ import annotations

import torch

from harness.capture.finalize import Placeholder, Sample


class SequenceTooLong(ValueError):
    """A sample does not fit ``policy.seq_len``."""


def build_train_batch(
    samples: list[Sample | Placeholder],
    *,
    seq_len: int,
    pad_token_id: int,
) -> dict[str, torch.Tensor]:
    """Pad samples to ``seq_len`` and return the train batch (without advantages/logprobs)."""
    B = len(samples)
    input_ids = torch.full((B, seq_len), pad_token_id, dtype=torch.long)
    input_lengths = torch.zeros(B, dtype=torch.long)
    token_mask = torch.zeros(B, seq_len, dtype=torch.float32)
    sample_mask = torch.zeros(B, dtype=torch.float32)
    gen_logprobs = torch.zeros(B, seq_len, dtype=torch.float32)
    for row, s in enumerate(samples):
        if isinstance(s, Placeholder) or not s.token_ids:
            continue
        n = len(s.token_ids)
        if n > seq_len:
            raise SequenceTooLong(
                f"rollout {s.rollout_id}: {n} tokens exceed policy.seq_len={seq_len} "
                "(raise policy.seq_len or lower rollout.max_new_tokens / env.turns)"
            )
        input_ids[row, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        input_lengths[row] = n
        token_mask[row, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        gen_logprobs[row, :n] = torch.tensor(s.generation_logprobs, dtype=torch.float32)
        sample_mask[row] = float(s.sample_mask)
    return {
        "input_ids": input_ids,
        "input_lengths": input_lengths,
        "token_mask": token_mask,
        "sample_mask": sample_mask,
        "generation_logprobs": gen_logprobs,
    }


def prompt_rows(prompt_token_ids: list[list[int]], generations: int, pad_token_id: int) -> torch.Tensor:
    """The ``[P*G, Lmax]`` prompt-token rows used to form advantage groups."""
    width = max(len(p) for p in prompt_token_ids)
    rows = torch.full((len(prompt_token_ids) * generations, width), pad_token_id, dtype=torch.long)
    for i, ids in enumerate(prompt_token_ids):
        rows[i * generations : (i + 1) * generations, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return rows


def slice_rows(batch: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    """The same rows of every tensor (for streaming prompt groups)."""
    return {k: v[rows] for k, v in batch.items()}
