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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.capture.digests import cumulative_hash, error_name
from harness.capture.ledger import CaptureLedger
from harness.capture.records import CaptureAdmission
from harness.capture.splice import PrefixCache, replace_prefix_tokens


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
        return AdmissionResult(_with_seq(admission, seq), [int(t) for t in prompt_ids])

    def admit_continuation(self, rollout_id: str, model_call_id: str, parent_call_id: str,
                           template_prefix_token_ids: Sequence[int],
                           template_token_ids: Sequence[int]) -> AdmissionResult:
        parent = self.ledger.get(rollout_id, parent_call_id)
        if parent is None:
            return self._fail(rollout_id, model_call_id, parent_call_id, "unresolved_parent:not_committed")
        if not parent.committed:
            return self._fail(rollout_id, model_call_id, parent_call_id, "unresolved_parent:parent_failed")
        try:
            prefix = self.prefix_cache.resolve(list(parent.staging_chain), self.dataplane.fetch_many)
        except Exception as exc:  # noqa: BLE001 - a missing or tampered row: fail closed
            return self._fail(rollout_id, model_call_id, parent_call_id,
                              f"unresolved_parent:fetch_failed:{error_name(exc)}")
        if len(prefix) != parent.cum_len or cumulative_hash(prefix) != parent.cumulative_hash:
            return self._fail(rollout_id, model_call_id, parent_call_id, "unresolved_parent:prefix_mismatch")
        try:
            prompt = replace_prefix_tokens(self.tokenizer, prefix, template_prefix_token_ids, template_token_ids,
                                           eos_token_id=self.eos_token_id)
        except AssertionError as exc:
            return self._fail(rollout_id, model_call_id, parent_call_id, f"splice_failed:{str(exc)[:200]}")
        if prompt[: len(prefix)] != prefix:
            # The model stopped on max_tokens and its last token differs from
            # nothing we can splice after; cannot happen with an EOS-terminated
            # prefix, kept as a guard.
            return self._fail(rollout_id, model_call_id, parent_call_id, "splice_failed:prefix_not_kept")
        admission = CaptureAdmission(
            rollout_id=rollout_id, model_call_id=model_call_id, mode="token_in",
            parent_call_id=parent_call_id, prev_len=parent.cum_len,
            staging_chain=tuple(parent.staging_chain), parent_chain_hash=parent.chain_hash,
        )
        seq = self.ledger.admit(admission)
        return AdmissionResult(_with_seq(admission, seq), prompt)

    def _fail(self, rollout_id: str, model_call_id: str, parent_call_id: str, reason: str) -> AdmissionResult:
        self.failures += 1
        self.ledger.record_failure(rollout_id, model_call_id, reason, parent_call_id=parent_call_id)
        return AdmissionResult(None, None, reason)


def _with_seq(admission: CaptureAdmission, seq: int) -> CaptureAdmission:
    data = admission.to_dict()
    data["admission_seq"] = seq
    return CaptureAdmission.from_dict(data)
