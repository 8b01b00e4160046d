"""Finalisation: receipt + staged rows -> training sample, or a masked placeholder.

`finalize_rollout` trusts nothing it did not verify:
  1. the receipt must be unpoisoned and name a committed terminal;
  2. the terminal's staging chain must consist of committed calls of this
     rollout (cross-checked against the ledger when one is given);
  3. every staged row is fetched (the store verifies its row digest), rebuilt
     as a `StagedCall` (which recomputes the delta digest) and compared with
     its ledger record: digest, prev_len == running length, delta_len, the
     chain hash recomputed link by link, and the cumulative hash;
  4. the deltas are concatenated into token ids, loss mask and generation
     logprobs.
Any failure gives a `Placeholder` (sample_mask 0, reason recorded), so a GRPO
group always keeps one row per rollout and no unverified token is trained on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.capture.digests import (
    chain_hash,
    cumulative_hash,
    delta_digest,
    error_name,
)
from harness.capture.ledger import CaptureLedger
from harness.capture.records import (
    CallRecord,
    CaptureValidationError,
    RolloutReceipt,
    StagedCall,
)


@dataclass(frozen=True)
class Sample:
    """A verified training sample. `generation_logprobs[t]` is the logprob the
    engine gave token t (0.0 on prompt/observation tokens, where loss_mask is 0)."""

    rollout_id: str
    token_ids: list[int]
    loss_mask: list[int]
    generation_logprobs: list[float]
    prompt_len: int
    reward: float
    weight_epoch: int | None
    calls: list[str]
    terminal_selection: str
    sample_digest: str
    sample_mask: float = 1.0
    masked: bool = False
    reason: str | None = None


@dataclass(frozen=True)
class Placeholder:
    """A masked stand-in for a rollout that must not be trained on."""

    rollout_id: str
    reason: str
    reward: float
    sample_mask: float = 0.0
    masked: bool = True
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    generation_logprobs: list[float] = field(default_factory=list)
    weight_epoch: int | None = None
    terminal_selection: str | None = None


class _Reject(Exception):
    pass


_LedgerRows = Mapping[tuple[str, str], CallRecord | None]


def finalize_rollout(receipt: RolloutReceipt, dataplane: Any, ledger: CaptureLedger | None = None, *,
                     prefetched: Mapping[str, dict[str, Any]] | None = None,
                     ledger_rows: _LedgerRows | None = None) -> Sample | Placeholder:
    """`prefetched`: rows already fetched (digest-verified) by key, e.g. one
    `fetch_many` for a whole group; keys it lacks are fetched here.
    `ledger_rows`: ledger records already read by `(rollout_id, model_call_id)`
    for the cross-check against `ledger` (one `get_many` for a group); calls
    it lacks are read here."""
    try:
        return _finalize(receipt, dataplane, ledger, prefetched or {}, ledger_rows or {})
    except _Reject as why:
        return Placeholder(receipt.rollout_id, str(why), receipt.reward)


def _finalize(receipt: RolloutReceipt, dataplane: Any, ledger: CaptureLedger | None,
              prefetched: Mapping[str, dict[str, Any]], ledger_rows: _LedgerRows) -> Sample:
    if receipt.capture_poisoned:
        raise _Reject(receipt.failure_reason or "poisoned")
    by_id = {c.model_call_id: c for c in receipt.manifest}
    terminal = by_id[receipt.terminal_model_call_id]  # receipt validation guarantees presence
    chain: list[CallRecord] = []
    prefix = f"{receipt.rollout_id}/"
    for key in terminal.staging_chain:
        if not key.startswith(prefix):
            raise _Reject(f"foreign_key_in_chain:{key}")
        rec = by_id.get(key[len(prefix):])
        if rec is None or not rec.committed:
            raise _Reject(f"chain_call_not_committed:{key}")
        if ledger is not None:
            call = (rec.rollout_id, rec.model_call_id)
            current = ledger_rows[call] if call in ledger_rows else ledger.get(*call)
            if current != rec:
                raise _Reject(f"receipt_disagrees_with_ledger:{key}")
        chain.append(rec)
    keys = [r.staging_key for r in chain]
    if all(k in prefetched for k in keys):
        rows = [prefetched[k] for k in keys]
    else:
        try:
            rows = dataplane.fetch_many(keys)
        except Exception as exc:  # noqa: BLE001 - any fetch error masks the rollout (fail closed)
            raise _Reject(f"fetch_failed:{error_name(exc)}") from None

    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    parent_hash: str | None = None
    for rec, row in zip(chain, rows):
        try:
            staged = StagedCall.from_row(row)
        except CaptureValidationError as exc:
            raise _Reject(f"staged_row_invalid:{rec.staging_key}:{str(exc)[:120]}") from None
        if staged.staging_key != rec.staging_key:
            raise _Reject(f"staged_key_mismatch:{rec.staging_key}")
        if staged.digest != rec.digest:
            raise _Reject(f"digest_mismatch:{rec.staging_key}")
        if staged.prev_len != len(ids) or rec.prev_len != len(ids):
            raise _Reject(f"prev_len_mismatch:{rec.staging_key}")
        if len(staged.token_ids_delta) != rec.delta_len:
            raise _Reject(f"delta_len_mismatch:{rec.staging_key}")
        parent_hash = chain_hash(parent_hash, staged.digest)
        if parent_hash != rec.chain_hash:
            raise _Reject(f"chain_hash_mismatch:{rec.staging_key}")
        ids.extend(staged.token_ids_delta)
        mask.extend(staged.token_mask_delta)
        logprobs.extend(staged.generation_log_probs_delta)
        if len(ids) != rec.cum_len:
            raise _Reject(f"cum_len_mismatch:{rec.staging_key}")
    if cumulative_hash(ids) != terminal.cumulative_hash:
        raise _Reject(f"cumulative_hash_mismatch:{terminal.staging_key}")
    if 1 not in mask:
        raise _Reject("no_trainable_tokens")
    epochs = [r.admission_epoch for r in chain if r.admission_epoch is not None]
    return Sample(
        rollout_id=receipt.rollout_id, token_ids=ids, loss_mask=mask, generation_logprobs=logprobs,
        prompt_len=mask.index(1), reward=float(receipt.reward), weight_epoch=min(epochs) if epochs else None,
        calls=[r.model_call_id for r in chain], terminal_selection=str(receipt.terminal_selection),
        sample_digest=delta_digest(ids, mask, logprobs),
    )


def finalize_group(receipts: Sequence[RolloutReceipt], dataplane: Any, ledger: CaptureLedger | None = None
                   ) -> tuple[list[Sample | Placeholder], dict[str, float]]:
    """Finalise every receipt of a group, in order: one row per receipt.

    The staged rows of all terminal chains are fetched with ONE `fetch_many`
    (one round trip to a data-plane actor; the store still verifies every
    row's digest), and their ledger records are re-read for the cross-check
    with ONE `ledger.get_many`. If the batch fetch fails (a missing or
    tampered row), each rollout fetches its own rows, so only the affected
    ones are masked.
    """
    keys = _chain_keys(receipts)
    prefetched = _prefetch(keys, dataplane)
    ledger_rows: dict[tuple[str, str], CallRecord | None] = {}
    if ledger is not None and keys:
        calls = [_split_key(k) for k in keys]
        ledger_rows = dict(zip(calls, ledger.get_many(calls)))
    results = [finalize_rollout(r, dataplane, ledger, prefetched=prefetched, ledger_rows=ledger_rows)
               for r in receipts]
    n = len(results)
    heuristic = sum(1 for r in receipts if r.terminal_selection == "heuristic")
    metrics = {
        "finalize/rollouts": float(n),
        "finalize/masked_count": float(sum(1 for x in results if x.masked)),
        "finalize/heuristic_terminal_fraction": heuristic / n if n else 0.0,
    }
    return results, metrics


def finalize_from_ledger(items: Sequence[tuple[str, float, str | None]], ledger: CaptureLedger, dataplane: Any
                         ) -> tuple[list[RolloutReceipt], list[Sample | Placeholder], dict[str, float]]:
    """Receipts and samples of one attempt straight from the ledger:
    `build_receipts(items, ledger)` then `finalize_group(receipts, dataplane)`.

    The receipt/ledger cross-check of `finalize_group(..., ledger)` guards
    receipts that travelled; these were just built from the ledger's rows, and
    ledger outcomes are final (insert-only: a committed row never changes), so
    they agree by construction and the rows are not read twice. Every staged
    row is still fetched and verified (digests, chain, lengths, cumulative hash).
    """
    from harness.capture.receipt import build_receipts

    receipts = build_receipts(items, ledger)
    samples, metrics = finalize_group(receipts, dataplane)
    return receipts, samples, metrics


def _chain_keys(receipts: Sequence[RolloutReceipt]) -> list[str]:
    """The staging keys of every unpoisoned receipt's terminal chain (deduplicated, in order)."""
    keys: list[str] = []
    for r in receipts:
        if r.capture_poisoned or r.terminal_model_call_id is None:
            continue
        terminal = next((c for c in r.manifest if c.model_call_id == r.terminal_model_call_id), None)
        if terminal is not None:
            keys.extend(terminal.staging_chain)
    return list(dict.fromkeys(keys))


def _split_key(key: str) -> tuple[str, str]:
    rid, _, cid = key.rpartition("/")
    return rid, cid


def _prefetch(keys: list[str], dataplane: Any) -> dict[str, dict[str, Any]]:
    if not keys:
        return {}
    try:
        return dict(zip(keys, dataplane.fetch_many(keys)))
    except Exception:  # noqa: BLE001 - fall back to per-rollout fetches: failures stay per rollout
        return {}


def rollout_summary(receipt: RolloutReceipt, result: Sample | Placeholder) -> dict[str, Any]:
    """Token-free per-rollout summary (one line of rollouts.jsonl; the `rollouts` surface)."""
    calls = [
        {
            "model_call_id": c.model_call_id, "status": c.status, "parent_call_id": c.parent_call_id,
            "prev_len": c.prev_len, "delta_len": c.delta_len, "output_len": c.output_len,
            "chain_hash": c.chain_hash, "admission_epoch": c.admission_epoch,
            "weight_version": c.weight_version, "failure_reason": c.failure_reason,
        }
        for c in receipt.manifest
    ]
    out: dict[str, Any] = {
        "rollout_id": receipt.rollout_id,
        "reward": float(receipt.reward),
        "calls": calls,
        "terminal_model_call_id": receipt.terminal_model_call_id,
        "terminal_selection": receipt.terminal_selection,
        "masked": result.masked,
        "mask_reason": result.reason,
    }
    if isinstance(result, Sample):
        out.update(tokens=len(result.token_ids), trainable_tokens=sum(result.loss_mask),
                   prompt_len=result.prompt_len, weight_epoch=result.weight_epoch,
                   sample_digest=result.sample_digest)
    return out


def sample_digest_of(token_ids: Sequence[int], loss_mask: Sequence[int], logprobs: Sequence[float]) -> str:
    """Digest of any (ids, mask, logprobs) triple, comparable with `Sample.sample_digest`."""
    return delta_digest(token_ids, loss_mask, logprobs)



# Placeholder reasons that mean a staged row did not verify (finalisation's own checks).
_VERIFICATION_REASONS = frozenset({
    "fetch_failed", "staged_row_invalid", "staged_key_mismatch", "digest_mismatch", "prev_len_mismatch",
    "delta_len_mismatch", "chain_hash_mismatch", "cum_len_mismatch", "cumulative_hash_mismatch",
    "foreign_key_in_chain", "chain_call_not_committed", "receipt_disagrees_with_ledger",
})


def mask_cause(reason: str | None) -> str:
    """What masked a rollout, in words and without its ids, from a `Placeholder.reason`:

    * ``unfinished call (incomplete_call)``: a call was admitted but has no outcome
      (``no_calls``: nothing was admitted);
    * ``failed call (<reason>)``: a call has a failure row, e.g. ``stage_failed:<Error>``,
      ``aborted:<why>``, ``unresolved_parent:<why>`` (the call id is dropped);
    * ``verification failed (<check>)``: a staged row is missing or does not match its
      ledger record (``fetch_failed:<Error>`` keeps the error name, the other checks drop the key);
    * ``no trainable tokens``; anything else is its first field.
    Equal causes give equal strings, so they can be counted.
    """
    text = str(reason or "unknown")
    head, _, rest = text.partition(":")
    if head in ("incomplete_call", "no_calls"):
        return f"unfinished call ({head})"
    if head == "call_failed":
        failure = rest.partition(":")[2] or "unknown"  # drop the call id
        return f"failed call ({failure[:80]})"
    if head in _VERIFICATION_REASONS:
        detail = text if head == "fetch_failed" else head
        return f"verification failed ({detail[:80]})"
    if head == "no_trainable_tokens":
        return "no trainable tokens"
    return head[:80]
