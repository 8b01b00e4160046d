"""Build a `RolloutReceipt` from the ledger: decide the terminal call.

Precedence: declared > heuristic > mask.
  * declared: the agent names its terminal call; it must be committed.
  * heuristic: from the earliest-admitted committed root, repeatedly follow
    the latest-admitted committed child; every earlier sibling must be a leaf
    (an abandoned retry) or the walk is ambiguous.
  * mask: anything else (ambiguity, no committed root).
A rollout with any failed call, or with an admitted call that has no outcome
(still in flight, lost), is poisoned regardless of the terminal: capture of it
is incomplete, so it must not be trained on.

`build_receipts` builds the receipts of a whole attempt from two ledger
queries (the trainer's driver calls it once per attempt); each receipt equals
the one `build_receipt` gives.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.capture.ledger import CaptureLedger
from harness.capture.records import CallRecord, RolloutReceipt


def build_receipt(rollout_id: str, ledger: CaptureLedger, *, reward: float,
                  declared_terminal: str | None = None) -> RolloutReceipt:
    admitted = [a.model_call_id for a in ledger.admitted(rollout_id)]
    return receipt_from(rollout_id, ledger.manifest(rollout_id), admitted, reward=reward,
                        declared_terminal=declared_terminal)


def build_receipts(items: Sequence[tuple[str, float, str | None]], ledger: CaptureLedger) -> list[RolloutReceipt]:
    """Receipts of `(rollout_id, reward, declared_terminal)` items, in order,
    from one manifest query and one admissions query for all of them."""
    rids = list(dict.fromkeys(rid for rid, _, _ in items))
    manifests = ledger.manifests(rids)
    admitted = ledger.admitted_call_ids(rids)
    return [receipt_from(rid, manifests[rid], admitted[rid], reward=reward,
                         declared_terminal=declared)
            for rid, reward, declared in items]


def receipt_from(rollout_id: str, manifest: list[CallRecord], admitted: Sequence[str], *, reward: float,
                 declared_terminal: str | None = None) -> RolloutReceipt:
    """The receipt of a rollout given its ledger manifest (admission order)
    and the ids of its admitted calls (pure; no I/O)."""
    by_id = {c.model_call_id: c for c in manifest}

    def poisoned(reason: str, terminal: str | None = None) -> RolloutReceipt:
        return RolloutReceipt(rollout_id=rollout_id, reward=float(reward), manifest=tuple(manifest),
                              terminal_model_call_id=terminal if terminal in by_id else None,
                              capture_poisoned=True, failure_reason=reason)

    if not manifest:
        return poisoned("no_calls")
    failed = [c for c in manifest if not c.committed]
    if failed:
        first = failed[0]
        return poisoned(f"call_failed:{first.model_call_id}:{first.failure_reason}", declared_terminal)
    missing = [cid for cid in admitted if cid not in by_id]
    if missing:
        return poisoned(f"incomplete_call:{missing[0]}", declared_terminal)

    if declared_terminal is not None:
        if declared_terminal not in by_id:
            return poisoned(f"declared_terminal_not_committed:{declared_terminal}")
        return RolloutReceipt(rollout_id=rollout_id, reward=float(reward), manifest=tuple(manifest),
                              terminal_model_call_id=declared_terminal, terminal_selection="declared",
                              terminal_attribution_reason="declared by the agent")
    terminal, why = heuristic_terminal(manifest)
    if terminal is None:
        return poisoned(f"ambiguous_terminal:{why}")
    return RolloutReceipt(rollout_id=rollout_id, reward=float(reward), manifest=tuple(manifest),
                          terminal_model_call_id=terminal, terminal_selection="heuristic",
                          terminal_attribution_reason=why)


def heuristic_terminal(manifest: list[CallRecord]) -> tuple[str | None, str]:
    """Return (terminal call id or None, reason). `manifest` is in admission order."""
    committed = [c for c in manifest if c.committed]
    roots = [c for c in committed if c.parent_call_id is None]
    if not roots:
        return None, "no committed root"
    children: dict[str, list[CallRecord]] = {}
    for c in committed:
        if c.parent_call_id is not None:
            children.setdefault(c.parent_call_id, []).append(c)
    node = roots[0]
    retries = 0
    while True:
        kids = children.get(node.model_call_id, [])
        if not kids:
            break
        *earlier, latest = kids
        for sib in earlier:
            if children.get(sib.model_call_id):
                return (
                    None,
                    f"fork at {node.model_call_id}: {sib.model_call_id} and {latest.model_call_id} both continue",
                )
        retries += len(earlier)
        node = latest
    why = f"earliest root {roots[0].model_call_id}, {retries} abandoned retries"
    if len(roots) > 1:
        why += f", later roots ignored: {[r.model_call_id for r in roots[1:]]}"
    return node.model_call_id, why
