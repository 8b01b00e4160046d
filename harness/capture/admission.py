"""Trainer-side admission: lineage resolution -> admission, or a failure row.

The agent loop asks for an admission before every model call:
  * `admit_root`: a new conversation (text mode); the prompt is the template
    rendering as is.
  * `admit_continuation`: a call continuing `parent_call_id`. The parent must
    be *committed* in the ledger (its staged row is durable). The parent's
    cumulative tokens (prompt + output as the model produced them) are
    resolved from the data plane through the `PrefixCache`, and
    `replace_prefix_tokens` splices them in front of the re-rendered template,
    so the prompt starts with the model's exact earlier tokens.
Unresolved lineage (parent missing, failed, not yet committed, or a splice
that cannot find its boundary) never becomes a silent new root: a failure row
is written for the new call and `AdmissionResult.ok` is False.

`admit_many` admits a whole turn at once (the trainer's driver calls it once
per turn): one ledger query for the parents, one `fetch_many` for every
uncached prefix row, one transaction for the failure rows and one for the
admissions. It returns exactly what `admit_root` / `admit_continuation`
called one by one, in order, would return and writes the same rows (the same
`admission_seq`s).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.capture.digests import cumulative_hash, error_name
from harness.capture.ledger import CaptureLedger
from harness.capture.records import CallRecord, CaptureAdmission
from harness.capture.splice import FetchRows, PrefixCache, replace_prefix_tokens


@dataclass(frozen=True)
class AdmissionRequest:
    """One call to admit: a root (`prompt_ids`) or a continuation of
    `parent_call_id` (`template_prefix_token_ids` + `template_token_ids`)."""

    rollout_id: str
    model_call_id: str
    prompt_ids: Sequence[int] | None = None
    parent_call_id: str | None = None
    template_prefix_token_ids: Sequence[int] | None = None
    template_token_ids: Sequence[int] | None = None

    @classmethod
    def root(cls, rollout_id: str, model_call_id: str, prompt_ids: Sequence[int]) -> AdmissionRequest:
        return cls(rollout_id, model_call_id, prompt_ids=prompt_ids)

    @classmethod
    def continuation(cls, rollout_id: str, model_call_id: str, parent_call_id: str,
                     template_prefix_token_ids: Sequence[int], template_token_ids: Sequence[int]) -> AdmissionRequest:
        return cls(rollout_id, model_call_id, parent_call_id=parent_call_id,
                   template_prefix_token_ids=template_prefix_token_ids, template_token_ids=template_token_ids)

    def __post_init__(self) -> None:
        if self.parent_call_id is None:
            if self.prompt_ids is None:
                raise ValueError(f"admission request {self.rollout_id}/{self.model_call_id}: a root needs prompt_ids")
        elif self.template_prefix_token_ids is None or self.template_token_ids is None:
            raise ValueError(f"admission request {self.rollout_id}/{self.model_call_id}: a continuation needs "
                             "template_prefix_token_ids and template_token_ids")


@dataclass(frozen=True)
class AdmissionResult:
    """`ok` => `admission` and `prompt_ids` are set; else `failure_reason` is."""

    admission: CaptureAdmission | None
    prompt_ids: list[int] | None
    failure_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.admission is not None

    def request_capture(self) -> dict[str, Any] | None:
        """The token-free dict to put under `request["capture"]`."""
        return None if self.admission is None else self.admission.to_dict()


class CaptureAdmitter:
    """Resolves lineage against the ledger and the data plane (store or client)."""

    def __init__(self, ledger: CaptureLedger, dataplane: Any, *, tokenizer: Any = None,
                 eos_token_id: int | None = None, prefix_cache: PrefixCache | None = None):
        self.ledger = ledger
        self.dataplane = dataplane
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache()
        self.failures = 0

    def admit_root(self, rollout_id: str, model_call_id: str, prompt_ids: Sequence[int]) -> AdmissionResult:
        admission = CaptureAdmission(rollout_id=rollout_id, model_call_id=model_call_id, mode="text")
        seq = self.ledger.admit(admission)
        return AdmissionResult(_with_seq(admission, seq), list(map(int, prompt_ids)))

    def admit_continuation(self, rollout_id: str, model_call_id: str, parent_call_id: str,
                           template_prefix_token_ids: Sequence[int],
                           template_token_ids: Sequence[int]) -> AdmissionResult:
        req = AdmissionRequest.continuation(rollout_id, model_call_id, parent_call_id, template_prefix_token_ids,
                                            template_token_ids)
        parent = self.ledger.get(rollout_id, parent_call_id)
        admission, prompt, reason = self._continuation(req, parent, self.dataplane.fetch_many)
        if admission is None:
            return self._fail(rollout_id, model_call_id, parent_call_id, reason or "admission_failed")
        seq = self.ledger.admit(admission)
        return AdmissionResult(_with_seq(admission, seq), prompt)

    def admit_many(self, requests: Sequence[AdmissionRequest]) -> list[AdmissionResult]:
        """Admit a batch of calls (see the module docstring); results in order.

        Raises `LedgerError` (no admission of the batch written) if a call was
        already admitted or has an outcome that a failure row cannot join.
        """
        reqs = list(requests)
        conts = [r for r in reqs if r.parent_call_id is not None]
        parents = dict(zip(((r.rollout_id, r.parent_call_id) for r in conts),
                           self.ledger.get_many([(r.rollout_id, str(r.parent_call_id)) for r in conts])))
        fetch = self._prefetched_rows([p.staging_chain for p in parents.values() if p is not None and p.committed])
        planned: list[tuple[CaptureAdmission | None, list[int] | None, str | None]] = []
        for r in reqs:
            if r.parent_call_id is None:
                adm = CaptureAdmission(rollout_id=r.rollout_id, model_call_id=r.model_call_id, mode="text")
                planned.append((adm, list(map(int, r.prompt_ids or ())), None))
            else:
                planned.append(self._continuation(r, parents[(r.rollout_id, r.parent_call_id)], fetch))
        seqs = iter(self.ledger.admit_many([adm for adm, _, _ in planned if adm is not None]))
        failed = [(r, why) for r, (adm, _, why) in zip(reqs, planned) if adm is None]
        failed_seqs = self.ledger.admission_seqs([(r.rollout_id, r.model_call_id) for r, _ in failed]) if failed else []
        failures = [CallRecord(rollout_id=r.rollout_id, model_call_id=r.model_call_id, status="failed",
                               parent_call_id=r.parent_call_id, admission_seq=seq,
                               failure_reason=why or "admission_failed")
                    for (r, why), seq in zip(failed, failed_seqs)]
        for err in self.ledger.record_many(failures):
            if err is not None:
                raise err
        self.failures += len(failures)
        return [AdmissionResult(_with_seq(adm, next(seqs)), prompt) if adm is not None
                else AdmissionResult(None, None, why) for adm, prompt, why in planned]

    def _prefetched_rows(self, chains: Sequence[Sequence[str]]) -> FetchRows:
        """A `fetch_rows` for `PrefixCache.resolve` that serves the rows of
        every chain's uncached suffix from ONE `fetch_many`. If that batch
        fetch fails (a missing or tampered row), each call fetches its own rows
        so the failure stays with the calls it concerns."""
        keys = list(dict.fromkeys(k for chain in chains for k in self.prefix_cache.missing_keys(chain)))
        if not keys:
            return self.dataplane.fetch_many
        try:
            rows = dict(zip(keys, self.dataplane.fetch_many(keys)))
        except Exception:  # noqa: BLE001 - per-call fetches below decide which calls fail
            return self.dataplane.fetch_many

        def fetch(want: list[str]) -> list[dict[str, Any]]:
            if all(k in rows for k in want):
                return [rows[k] for k in want]
            return list(self.dataplane.fetch_many(want))

        return fetch

    def _continuation(self, req: AdmissionRequest, parent: CallRecord | None, fetch_rows: FetchRows
                      ) -> tuple[CaptureAdmission | None, list[int] | None, str | None]:
        """Resolve a continuation against its parent's ledger row: (admission,
        prompt, None), or (None, None, the failure reason). No writes."""
        if parent is None:
            return None, None, "unresolved_parent:not_committed"
        if not parent.committed:
            return None, None, "unresolved_parent:parent_failed"
        try:
            prefix = self.prefix_cache.resolve(list(parent.staging_chain), fetch_rows)
        except Exception as exc:  # noqa: BLE001 - a missing or tampered row: fail closed
            return None, None, f"unresolved_parent:fetch_failed:{error_name(exc)}"
        if len(prefix) != parent.cum_len or cumulative_hash(prefix) != parent.cumulative_hash:
            return None, None, "unresolved_parent:prefix_mismatch"
        try:
            prompt = replace_prefix_tokens(self.tokenizer, prefix, req.template_prefix_token_ids or (),
                                           req.template_token_ids or (), eos_token_id=self.eos_token_id)
        except AssertionError as exc:
            return None, None, f"splice_failed:{str(exc)[:200]}"
        if prompt[: len(prefix)] != prefix:
            # The model stopped on max_tokens and its last token differs from
            # nothing we can splice after; cannot happen with an EOS-terminated
            # prefix, kept as a guard.
            return None, None, "splice_failed:prefix_not_kept"
        admission = CaptureAdmission(
            rollout_id=req.rollout_id, model_call_id=req.model_call_id, mode="token_in",
            parent_call_id=req.parent_call_id, prev_len=parent.cum_len,
            staging_chain=tuple(parent.staging_chain), parent_chain_hash=parent.chain_hash,
        )
        return admission, prompt, None

    def _fail(self, rollout_id: str, model_call_id: str, parent_call_id: str, reason: str) -> AdmissionResult:
        self.failures += 1
        self.ledger.record_failure(rollout_id, model_call_id, reason, parent_call_id=parent_call_id)
        return AdmissionResult(None, None, reason)


def _with_seq(admission: CaptureAdmission, seq: int) -> CaptureAdmission:
    return dataclasses.replace(admission, admission_seq=seq)
