"""The capture ledger as a hypothesis state machine over real SQLite stores.

Operations, in any order the API allows: admit a root (a new rollout), admit
a continuation (mostly of a committed call, sometimes of any call), begin,
finish (stage succeeds, stage fails, non-finite logprobs, or the engine
aborts), begin a wave (all admitted calls), finish a batch (group commit: several in-flight calls at once, with
per-call staging failures, bad logprobs and aborts mixed in, sometimes the
whole stage batch lost), refit, build a receipt (declared or heuristic
terminal) and finalise.

Invariants after every step:
  * no committed record without a durable staged row whose digest matches;
  * a failed call is never a parent of a committed call;
  * the ledger agrees with the model's view of every call (so in a batch
    exactly the calls that should fail have failure rows, the others commit);
and at every finalisation:
  * a sample equals the concatenation of the calls' deltas as the model
    recorded them (tokens, mask, float32 logprobs);
  * a rollout with a failed or unfinished call never yields a sample.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from harness.capture.admission import CaptureAdmitter
from harness.capture.finalize import Placeholder, Sample, finalize_rollout
from harness.capture.ledger import CaptureLedger
from harness.capture.receipt import build_receipt
from harness.capture.records import StagedCall
from harness.capture.sink import CaptureSink
from harness.dataplane.staging_db import StagingDB

EOS = 2


OUTPUTS = st.lists(st.integers(10, 30), min_size=0, max_size=4)
OUTCOMES = st.integers(0, 7)
NOW = st.one_of(st.none(), st.tuples(OUTPUTS, st.booleans(), OUTCOMES))


class FlakyDataPlane:
    """The real store, with switches for staging failures the way a lost
    data-plane ack would surface: `fail_next` makes the next stage call (a
    whole batch) raise; `fail_keys` makes those rows of a batch come back as
    errors (the store's per-row outcome) while the rest are really staged."""

    def __init__(self, store: StagingDB):
        self.store = store
        self.fail_next = False
        self.fail_keys: set[str] = set()

    def stage(self, key, row):
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError(f"data plane unavailable while staging {key}")
        return self.store.stage(key, row)

    def stage_many(self, items):
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError(f"data plane unavailable while staging {len(items)} rows")
        acks = iter(self.store.stage_many([(k, r) for k, r in items if k not in self.fail_keys]))
        return [ConnectionError(f"lost ack for {k}") if k in self.fail_keys else next(acks) for k, _ in items]

    def fetch_many(self, keys):
        return self.store.fetch_many(keys)


def _generated(out: list[int], eos: bool, outcome: int) -> tuple[list[int], list[float], np.ndarray]:
    """The engine's output for a call: ids, the logprobs the model records,
    and the array handed to the sink (outcome 2 poisons its first entry)."""
    output = out + ([EOS] if eos else [])
    logprobs = [-0.125 * (i + 1) for i in range(len(output))]
    lp = np.array(logprobs)
    if outcome == 2 and output:
        lp[0] = np.nan
    return output, logprobs, lp


@dataclass
class Call:
    rollout: str
    cid: str
    parent: str | None
    prompt: list[int]
    state: str = "admitted"  # admitted | in_flight | committed | failed
    handle: str | None = None
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ledger_sm_")
        self.ledger = CaptureLedger(f"{self.dir}/ledger.sqlite")
        self.store = StagingDB(f"{self.dir}/dataplane.sqlite")
        self.dp = FlakyDataPlane(self.store)
        self.sink = CaptureSink(self.dp, CaptureLedger(f"{self.dir}/ledger.sqlite"))
        self.admitter = CaptureAdmitter(self.ledger, self.dp, eos_token_id=EOS)
        self.calls: dict[tuple[str, str], Call] = {}
        self.version = 0
        self.n = 0
        self.samples = 0

    def teardown(self) -> None:
        self.sink.close()
        self.ledger.close()
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _new_cid(self) -> str:
        self.n += 1
        return f"c{self.n}"

    def _cum(self, call: Call) -> list[int]:
        return call.prompt + call.output

    def _in(self, state: str) -> list[Call]:
        return [c for c in self.calls.values() if c.state == state]

    # -- rules ---------------------------------------------------------------
    @rule(prompt=st.lists(st.integers(10, 30), min_size=1, max_size=4), now=NOW)
    def admit_root(self, prompt, now):
        cid = self._new_cid()
        rollout = f"r{self.n}"
        res = self.admitter.admit_root(rollout, cid, prompt)
        assert res.ok and res.prompt_ids == prompt
        self.calls[(rollout, cid)] = call = Call(rollout, cid, None, prompt)
        self._maybe_run_now(call, now)

    def _maybe_run_now(self, call: Call, now) -> None:
        """Most calls run straight through (begin + finish); others interleave via the rules."""
        if now is not None:
            self._begin(call)
            self._finish(call, *now)

    @precondition(lambda self: any(c.state == "committed" for c in self.calls.values()))
    @rule(data=st.data(), obs=st.lists(st.integers(10, 30), min_size=1, max_size=3), now=NOW)
    def admit_continuation(self, data, obs, now):
        everything = sorted(self.calls.values(), key=lambda c: (c.rollout, c.cid))
        committed = [c for c in everything if c.state == "committed"]
        # mostly continue committed calls (the useful path), sometimes anything (the lineage-failure path)
        pool = committed if data.draw(st.integers(0, 5)) else everything
        parent = data.draw(st.sampled_from(pool))
        cid = self._new_cid()
        res = self.admitter.admit_continuation(parent.rollout, cid, parent.cid, [EOS], [EOS] + obs)
        if parent.state == "committed":
            cum = self._cum(parent)
            expected = (cum[:-1] if cum[-1] == EOS else cum) + [EOS] + obs
            assert res.ok and res.prompt_ids == expected
            self.calls[(parent.rollout, cid)] = call = Call(parent.rollout, cid, parent.cid, expected)
            self._maybe_run_now(call, now)
        else:
            assert not res.ok and res.failure_reason.startswith("unresolved_parent:")
            self.calls[(parent.rollout, cid)] = Call(parent.rollout, cid, parent.cid, [], state="failed")

    @precondition(lambda self: any(c.state == "admitted" for c in self.calls.values()))
    @rule(data=st.data())
    def begin(self, data):
        self._begin(data.draw(st.sampled_from(self._in("admitted"))))

    def _begin(self, call: Call) -> None:
        adm = {a.model_call_id: a for a in self.ledger.admitted(call.rollout)}[call.cid]
        call.handle = self.sink.begin_request(adm.to_dict(), call.prompt, weight_version=self.version)
        call.state = "in_flight"

    @precondition(lambda self: any(c.state == "in_flight" for c in self.calls.values()))
    @rule(data=st.data(), out=OUTPUTS, eos=st.booleans(), outcome=OUTCOMES)
    def finish(self, data, out, eos, outcome):
        self._finish(data.draw(st.sampled_from(self._in("in_flight"))), out, eos, outcome)

    def _finish(self, call: Call, out: list[int], eos: bool, outcome: int) -> None:
        """outcome 0: the engine aborts; 1: staging fails; 2: a non-finite
        logprob (when there is an output); otherwise the stage succeeds."""
        if outcome == 0:
            assert self.sink.abort_request(call.handle, "cancelled")["disposition"] == "capture_failed"
            call.state = "failed"
            return
        output, logprobs, lp = _generated(out, eos, outcome)
        self.dp.fail_next = outcome == 1
        coords = self.sink.finish_request(call.handle, output, lp, self.version)
        self.dp.fail_next = False
        self._settle(call, coords, output, logprobs, outcome, lost=False)

    def _settle(self, call: Call, coords: dict, output: list[int], logprobs: list[float], outcome: int,
                lost: bool) -> None:
        """Check one call's coords against what must have happened; update the model."""
        parent = self.calls.get((call.rollout, call.parent)) if call.parent else None
        bad_lp = outcome == 2 and bool(output)
        if outcome == 1 or lost or bad_lp or (parent is not None and parent.state != "committed"):
            assert coords["disposition"] == "capture_failed", coords
            want = "nonfinite_logprobs" if bad_lp else "stage_failed:ConnectionError"
            assert coords["failure_reason"] == want, coords
            call.state = "failed"
        else:
            assert coords["disposition"] == "staged", coords
            call.state, call.output, call.logprobs = "committed", output, logprobs

    @precondition(lambda self: any(c.state == "admitted" for c in self.calls.values()))
    @rule()
    def begin_wave(self):
        """The engine takes every admitted call at once (what a finish batch then commits)."""
        for call in self._in("admitted"):
            self._begin(call)

    @precondition(lambda self: any(c.state == "in_flight" for c in self.calls.values()))
    @rule(data=st.data(), lost=st.integers(0, 7))
    def finish_batch(self, data, lost):
        """Group commit of some in-flight calls; `lost == 0`: the whole stage batch fails."""
        chosen = data.draw(st.lists(st.sampled_from(self._in("in_flight")), min_size=1, max_size=8,
                                    unique_by=lambda c: (c.rollout, c.cid)))
        self._finish_batch(chosen, [data.draw(st.tuples(OUTPUTS, st.booleans(), OUTCOMES)) for _ in chosen], lost)

    @rule(prompts=st.lists(st.lists(st.integers(10, 30), min_size=1, max_size=4), min_size=2, max_size=6),
          data=st.data(), lost=st.integers(0, 7))
    def wave(self, prompts, data, lost):
        """Several new rollouts and every committed call's continuation run
        as one engine batch, finished by one group commit."""
        calls = []
        for prompt in prompts:
            cid = self._new_cid()
            rollout = f"r{self.n}"
            assert self.admitter.admit_root(rollout, cid, prompt).ok
            self.calls[(rollout, cid)] = call = Call(rollout, cid, None, prompt)
            calls.append(call)
        leaves = {c.rollout: c for c in sorted(self._in("committed"), key=lambda c: int(c.cid[1:]))}
        for parent in list(leaves.values())[:4]:
            cid = self._new_cid()
            res = self.admitter.admit_continuation(parent.rollout, cid, parent.cid, [EOS], [EOS, 17])
            assert res.ok
            self.calls[(parent.rollout, cid)] = call = Call(parent.rollout, cid, parent.cid, res.prompt_ids)
            calls.append(call)
        for call in calls:
            self._begin(call)
        self._finish_batch(calls, [data.draw(st.tuples(OUTPUTS, st.booleans(), OUTCOMES)) for _ in calls], lost)

    def _finish_batch(self, chosen: list[Call], plans: list[tuple], lost: int) -> None:
        aborted = [c for c, (_, _, outcome) in zip(chosen, plans) if outcome == 0]
        if aborted:
            for c, coords in zip(aborted, self.sink.abort_requests([c.handle for c in aborted], "cancelled")):
                assert coords["disposition"] == "capture_failed"
                assert coords["failure_reason"] == "aborted:cancelled"
                c.state = "failed"
        kept = [(c, plan) for c, plan in zip(chosen, plans) if plan[2] != 0]
        if not kept:
            return
        generated = [_generated(*plan) for _, plan in kept]
        self.dp.fail_keys = {c.handle for c, plan in kept if plan[2] == 1}
        self.dp.fail_next = lost == 0
        coords = self.sink.finish_requests([(c.handle, out, lp, self.version)
                                            for (c, _), (out, _, lp) in zip(kept, generated)])
        self.dp.fail_keys, self.dp.fail_next = set(), False
        assert len(coords) == len(kept)
        for (c, plan), (output, logprobs, _), co in zip(kept, generated, coords):
            assert (co["rollout_id"], co["model_call_id"]) == (c.rollout, c.cid)  # coords come back in order
            self._settle(c, co, output, logprobs, plan[2], lost=lost == 0)

    @rule()
    def refit(self):
        self.version += 1

    @precondition(lambda self: any(c.state == "committed" for c in self.calls.values()))
    @rule(data=st.data())
    def receipt_and_finalise(self, data):
        rollout = data.draw(st.sampled_from(sorted({c.rollout for c in self.calls.values() if c.state == "committed"})))
        mine = [c for c in self.calls.values() if c.rollout == rollout]
        committed = [c for c in mine if c.state == "committed"]
        declared = data.draw(st.sampled_from([None] + [c.cid for c in committed]))
        receipt = build_receipt(rollout, self.ledger, reward=1.0, declared_terminal=declared)
        result = finalize_rollout(receipt, self.dp, self.ledger)
        poisoned = not mine or any(c.state != "committed" for c in mine)
        if poisoned:
            assert isinstance(result, Placeholder) and result.sample_mask == 0.0
            return
        if receipt.terminal_model_call_id is None:  # only an ambiguous heuristic may mask a clean rollout
            assert declared is None and result.reason.startswith("ambiguous_terminal"), result.reason
            return
        terminal = self.calls[(rollout, receipt.terminal_model_call_id)]
        if declared is not None:
            assert terminal.cid == declared
        # the independent linearisation: walk the model's parents
        chain = [terminal]
        while chain[-1].parent is not None:
            chain.append(self.calls[(rollout, chain[-1].parent)])
        chain.reverse()
        if not any(c.output for c in chain):  # nothing generated: nothing to train on
            assert isinstance(result, Placeholder) and result.reason == "no_trainable_tokens"
            return
        assert isinstance(result, Sample), result
        self.samples += 1
        ids, mask, lps = [], [], []
        for c in chain:
            new = c.prompt[len(ids):]
            assert c.prompt[: len(ids)] == ids
            ids += new + c.output
            mask += [0] * len(new) + [1] * len(c.output)
            lps += [0.0] * len(new) + [float(np.float32(x)) for x in c.logprobs]
        assert (result.token_ids, result.loss_mask, result.generation_logprobs) == (ids, mask, lps)

    # -- invariants ----------------------------------------------------------
    @invariant()
    def committed_rows_are_staged_and_parents_never_failed(self):
        for rollout in sorted({c.rollout for c in self.calls.values()}):
            for rec in self.ledger.manifest(rollout):
                model = self.calls[(rollout, rec.model_call_id)]
                assert rec.status == ("committed" if model.state == "committed" else "failed")
                if rec.committed:
                    staged = StagedCall.from_row(self.store.fetch(rec.staging_key))  # digest-verified
                    assert staged.digest == rec.digest
                    if rec.parent_call_id is not None:
                        assert self.ledger.get(rollout, rec.parent_call_id).committed
        for call in self.calls.values():
            if call.state == "failed":
                assert self.ledger.get(call.rollout, call.cid).status == "failed"


TestLedgerMachine = LedgerMachine.TestCase
# Each step does real fsyncs: bound the ci profile; nightly keeps its own example count.
if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
    TestLedgerMachine.settings = settings(max_examples=30, stateful_step_count=40)
