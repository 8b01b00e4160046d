"""Rollout throughput with token capture on vs off (goal: on/off >= 0.95).

A synthetic multi-turn rollout loop: a small torch decoder stands in for the
engine (greedy over a seeded random MLP "LM", one forward per token, 1 thread),
an agent loop renders a Qwen3-like template, and with capture on every call is
admitted (prefix resolved + spliced), staged durably (SQLite WAL,
synchronous=FULL), committed to the ledger, and every rollout is receipted and
finalised. With capture off the same tokens are produced and linearised by
plain list concatenation.

    python3 benches/capture_overhead.py [--rollouts 24] [--turns 3] [--tokens 32] [--dir DIR]

Prints tokens/s for both modes and the ratio. Timings are wall-clock on
whatever else the box is doing; run it a few times.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import torch

from harness.capture.admission import CaptureAdmitter
from harness.capture.finalize import finalize_group
from harness.capture.ledger import CaptureLedger
from harness.capture.receipt import build_receipt
from harness.capture.sink import CaptureSink
from harness.dataplane.store import DataPlaneStore

EOS, IM_START, NL = 2, 1, 3
VOCAB, HIDDEN = 2048, 512


class TinyEngine:
    def __init__(self, seed: int = 0):
        torch.manual_seed(seed)
        self.emb = torch.randn(VOCAB, HIDDEN) * 0.02
        self.w1 = torch.randn(HIDDEN, 4 * HIDDEN) * 0.02
        self.w2 = torch.randn(4 * HIDDEN, HIDDEN) * 0.02
        self.out = torch.randn(HIDDEN, VOCAB) * 0.02

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new: int) -> tuple[list[int], list[float]]:
        state = self.emb[torch.tensor(prompt[-64:])].mean(0)
        ids, lps = [], []
        for _ in range(max_new):
            h = state + torch.relu(state @ self.w1) @ self.w2
            logp = torch.log_softmax(h @ self.out, -1)
            tok = int(torch.argmax(logp[10:])) + 10
            ids.append(tok)
            lps.append(float(logp[tok]))
            state = 0.9 * state + self.emb[tok]
        ids[-1] = EOS
        return ids, lps


def render(messages: list[list[int]], gen: bool) -> list[int]:
    out: list[int] = []
    for i, content in enumerate(messages):
        out += [IM_START, 5 if i % 2 == 0 else 6, NL] + content + [EOS, NL]
    return out + ([IM_START, 6, NL] if gen else [])


def run(engine: TinyEngine, rollouts: int, turns: int, tokens: int, capture_dir: str | None) -> tuple[float, int]:
    if capture_dir:
        ledger = CaptureLedger(f"{capture_dir}/ledger.sqlite")
        dp = DataPlaneStore(f"{capture_dir}/dataplane.sqlite")
        sink = CaptureSink(dp, CaptureLedger(f"{capture_dir}/ledger.sqlite"))
        admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    produced = 0
    receipts, plain = [], []
    t0 = time.perf_counter()
    for r in range(rollouts):
        rid = f"r{r}"
        messages = [[20 + r % 50, 21]]
        prompt = render(messages, True)
        seq: list[int] = []
        for t in range(turns):
            cid = f"c{t}"
            if capture_dir:
                res = (admitter.admit_root(rid, cid, prompt) if t == 0 else
                       admitter.admit_continuation(rid, cid, f"c{t - 1}", render(messages[:-1], False),
                                                   render(messages, True)))
                prompt = res.prompt_ids
                h = sink.begin_request(res.request_capture(), prompt, weight_version=0)
            else:
                prompt = (seq[:-1] + render(messages, True)[len(render(messages[:-1], False)) - 2:]) if t else prompt
            out, lps = engine.generate(prompt, tokens)
            produced += len(out)
            if capture_dir:
                sink.finish_request(h, out, lps, 0)
            seq = prompt + out
            messages += [out[:-1], [30 + t, 31]]
        if capture_dir:
            receipts.append(build_receipt(rid, ledger, reward=1.0))
        else:
            plain.append(seq)
    if capture_dir:
        samples, metrics = finalize_group(receipts, dp, ledger)
        assert metrics["finalize/masked_count"] == 0
    elapsed = time.perf_counter() - t0
    if capture_dir:
        sink.close()
        ledger.close()
        dp.close()
    return elapsed, produced


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=24)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32, help="generated tokens per call")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the SQLite files go (default: a temp dir)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    engine = TinyEngine()
    run(engine, 2, args.turns, args.tokens, None)  # warm-up
    best_off, best_on, n = float("inf"), float("inf"), 0
    for _ in range(args.repeats):  # interleave to share background noise
        t_off, n = run(engine, args.rollouts, args.turns, args.tokens, None)
        d = tempfile.mkdtemp(prefix="capture_bench_", dir=args.dir)
        try:
            t_on, n_on = run(engine, args.rollouts, args.turns, args.tokens, d)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        assert n_on == n
        best_off, best_on = min(best_off, t_off), min(best_on, t_on)
    calls = args.rollouts * args.turns
    print(f"rollouts={args.rollouts} turns={args.turns} tokens/call={args.tokens} calls={calls} "
          f"dir={args.dir or tempfile.gettempdir()}")
    print(f"capture off: {n / best_off:10.1f} tok/s  ({best_off:.3f} s)")
    print(f"capture on : {n / best_on:10.1f} tok/s  ({best_on:.3f} s)  "
          f"[{1e3 * (best_on - best_off) / calls:.2f} ms overhead per call]")
    print(f"ratio on/off: {best_off / best_on:.3f}  (goal >= 0.95)")


if __name__ == "__main__":
    main()
