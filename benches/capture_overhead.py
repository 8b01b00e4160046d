"""Rollout throughput with token capture on vs off (goal: on/off >= 0.95).

Two workloads, each measured with capture on and off side by side in one run
(interleaved repeats, best-of and median reported):

``--workload synthetic`` (default) -- a synthetic, turn-synchronous
multi-turn rollout loop (every turn, the calls of all rollouts finish as one
capture batch, as with the trainer's driver): a small torch decoder stands in for the
engine (greedy over a seeded random MLP "LM", one forward per token, 1 thread),
an agent loop renders a Qwen3-like template, and with capture on every call is
admitted (prefix resolved + spliced), staged durably (SQLite WAL,
synchronous=FULL), committed to the ledger, and every rollout is receipted and
finalised. With capture off the same tokens are produced and linearised by
plain list concatenation.

    python3 benches/capture_overhead.py [--rollouts 24] [--turns 3] [--tokens 32] [--dir DIR]

``--workload smoke`` -- the real engine path of a golden workload (default
``qwen3_moe_tiny_smoke``, ``--golden NAME`` for another single-turn one):
Ray, the named data-plane actor, a real ``RolloutWorker`` actor with the
native engine, and the trainer's ``RolloutDriver``. One rollout attempt per
step with capture on (admission, engine-side staging + ledger commit,
receipts, finalisation from verified rows) and one with it off (the engine
result is the sample), same prompts and same per-request seeds, the same
worker serving both. The figure is generation wall time per step (what the
trainer records as ``timings["generation"]``, minus the profiler window).

    python3 benches/capture_overhead.py --workload smoke [--steps 6] [--repeats 3]

``--workload phases`` -- the smoke workload with the worker in the bench's
process, every capture phase timed (admission, begin, row building, stage
transaction, ledger transaction, receipts, finalisation): where the overhead
goes.

``--workload both`` runs the two one after the other. Ratios are off/on time
(>= 0.95 means capture costs at most ~5 %): of the medians, of the bests, and
the paired median (median of off/on over back-to-back pairs, the most robust
to background load). Timings are wall-clock on whatever else the box is
doing; run it a few times.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from harness.capture.admission import AdmissionRequest, CaptureAdmitter
from harness.capture.finalize import finalize_group
from harness.capture.ledger import CaptureLedger
from harness.capture.receipt import build_receipts
from harness.capture.sink import CaptureSink
from harness.dataplane.staging_db import StagingDB
from harness.spec.typed import Workload

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
    """Turn-synchronous like the trainer's driver: every turn, all rollouts'
    calls are admitted and begun as one batch, generated (one by one: the
    stand-in has no batching) and then finished together, the engine owner's
    one capture batch; one receipt batch and one finalisation at the end."""
    if capture_dir:
        ledger = CaptureLedger(f"{capture_dir}/ledger.sqlite")
        dp = StagingDB(f"{capture_dir}/dataplane.sqlite")
        sink = CaptureSink(dp, CaptureLedger(f"{capture_dir}/ledger.sqlite"))
        admitter = CaptureAdmitter(ledger, dp, eos_token_id=EOS)
    produced = 0
    messages = [[[20 + r % 50, 21]] for r in range(rollouts)]
    prompts = [render(m, True) for m in messages]
    seqs: list[list[int]] = [[] for _ in range(rollouts)]
    t0 = time.perf_counter()
    for t in range(turns):
        if capture_dir:  # one admission batch and one begin batch per turn, as the driver and worker do
            reqs = [AdmissionRequest.root(f"r{r}", f"c{t}", prompts[r]) if t == 0 else
                    AdmissionRequest.continuation(f"r{r}", f"c{t}", f"c{t - 1}", render(messages[r][:-1], False),
                                                  render(messages[r], True)) for r in range(rollouts)]
            admitted = admitter.admit_many(reqs)
            handles = sink.begin_requests([(a.request_capture(), a.prompt_ids) for a in admitted], weight_version=0)
        finished = []
        for r in range(rollouts):
            msgs = messages[r]
            if capture_dir:
                prompt = admitted[r].prompt_ids
            else:
                prompt = (seqs[r][:-1] + render(msgs, True)[len(render(msgs[:-1], False)) - 2:]) if t else prompts[r]
            out, lps = engine.generate(prompt, tokens)
            produced += len(out)
            if capture_dir:
                finished.append((handles[r], out, lps, 0))
            seqs[r] = prompt + out
            msgs += [out[:-1], [30 + t, 31]]
        if capture_dir:
            _finish(sink, finished)
    if capture_dir:
        receipts = build_receipts([(f"r{r}", 1.0, None) for r in range(rollouts)], ledger)
        _samples, metrics = finalize_group(receipts, dp, ledger)
        assert metrics["finalize/masked_count"] == 0
    elapsed = time.perf_counter() - t0
    if capture_dir:
        sink.close()
        ledger.close()
        dp.close()
    return elapsed, produced


def _finish(sink: CaptureSink, finished: list) -> None:
    """One group commit per turn (a sink without `finish_requests` finishes call by call)."""
    batch = getattr(sink, "finish_requests", None)
    if callable(batch):
        coords = batch(finished)
    else:
        coords = [sink.finish_request(*f) for f in finished]
    assert all(c["disposition"] == "staged" for c in coords), coords


def synthetic(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    engine = TinyEngine()
    run(engine, 2, args.turns, args.tokens, None)  # warm-up
    offs, ons, n = [], [], 0
    for _ in range(args.repeats):  # interleave to share background noise
        t_off, n = run(engine, args.rollouts, args.turns, args.tokens, None)
        d = tempfile.mkdtemp(prefix="capture_bench_", dir=args.dir)
        try:
            t_on, n_on = run(engine, args.rollouts, args.turns, args.tokens, d)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        assert n_on == n
        offs.append(t_off)
        ons.append(t_on)
    best_off, best_on = min(offs), min(ons)
    calls = args.rollouts * args.turns
    print(f"[synthetic] rollouts={args.rollouts} turns={args.turns} tokens/call={args.tokens} calls={calls} "
          f"repeats={args.repeats} dir={args.dir or tempfile.gettempdir()}")
    print(f"capture off: {n / best_off:10.1f} tok/s  ({best_off:.3f} s)")
    print(f"capture on : {n / best_on:10.1f} tok/s  ({best_on:.3f} s)  "
          f"[{1e3 * (best_on - best_off) / calls:.2f} ms overhead per call]")
    print(f"ratio on/off: best {best_off / best_on:.3f}  median {statistics.median(offs) / statistics.median(ons):.3f}"
          f"  paired median {_paired(offs, ons):.3f}  (goal >= 0.95)")


def _capture_parts(spec: Workload, run_dir: Path, actor_name: str):
    """The driver side of a captured rollout, as the runner builds it: the named
    data-plane actor and its client, the ledger, tokenizer, admitter, prompt
    loader and episode environment (Ray must be up)."""
    from harness.dataplane.actor import DataPlaneClient, start_dataplane_actor
    from harness.envs.tasks import PromptLoader, make_task
    from harness.envs.tokenizer import load_tokenizer
    from harness.grpo.episodes import make_episode_env

    client = DataPlaneClient(start_dataplane_actor(actor_name, str(run_dir / "dataplane.sqlite")))
    ledger = CaptureLedger(run_dir / "ledger.sqlite")
    tokenizer = load_tokenizer()
    admitter = CaptureAdmitter(ledger, client, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)
    task = make_task(spec.env.task, spec.seed)
    loader = PromptLoader(task, spec.grpo.prompts_per_step, spec.seed)
    return client, ledger, tokenizer, admitter, loader, make_episode_env(spec.env, task, tokenizer)


def smoke(args: argparse.Namespace) -> None:
    """The real engine path of a golden workload, capture on vs off (see module docstring)."""
    import os

    import ray

    from harness.capture.sink import capture_config_from_spec
    from harness.grpo.rollouts import RolloutDriver
    from harness.rollout.worker import rollout_worker_actor
    from harness.spec.load import load_spec

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    spec = load_spec(args.golden, ("capture.enabled=true",))
    if spec.env.turns != 1:
        raise SystemExit(f"--golden {args.golden}: env.turns must be 1 (capture off needs single-turn episodes)")
    env_vars = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    run_dir = Path(tempfile.mkdtemp(prefix="capture_bench_smoke_", dir=args.dir))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env_vars})
    try:
        name = f"dataplane-bench-{os.getpid()}"
        client, ledger, tokenizer, admitter, loader, env = _capture_parts(spec, run_dir, name)
        cfg = capture_config_from_spec(spec, run_dir, dataplane_actor=name)
        if args.sink_dataplane == "path":  # the sink opens the actor's SQLite file itself, no client
            cfg = {**{k: v for k, v in cfg.items() if k != "dataplane_actor"},
                   "dataplane_path": str(run_dir / "dataplane.sqlite")}
        elif args.sink_dataplane == "actor":  # every stage batch is a round trip to the data-plane actor
            cfg = {**cfg, "dataplane_local_writes": False}
        worker = rollout_worker_actor().remote(spec, 0, 0, str(run_dir), env_vars=env_vars, capture_config=cfg)
        ray.get(worker.ready.remote())
        on = RolloutDriver(spec, [worker], tokenizer, env, (admitter, ledger, client))
        off = RolloutDriver(spec, [worker], tokenizer, env, None)
        batches = [loader.next_batch() for _ in range(args.steps)]
        on.run_attempt(batches[0], 0, 1)  # warm-up: sink, data-plane connection, engine caches
        off.run_attempt(batches[0], 0, 1)
        t_off: list[float] = []
        t_on: list[float] = []
        rows = 0
        for rep in range(args.repeats):
            for step, prompts in enumerate(batches, start=1):
                attempt = rep + 1  # unique rollout ids per repeat; same seeds in both modes
                t = time.perf_counter()
                res_off = off.run_attempt(prompts, step, attempt)
                t_off.append(time.perf_counter() - t)
                t = time.perf_counter()
                res_on = on.run_attempt(prompts, step, attempt)
                t_on.append(time.perf_counter() - t)
                if res_on.metrics.get("finalize/masked_count", 0.0) != 0.0:
                    raise SystemExit(f"capture masked rows at step {step}: {res_on.metrics}")
                same = [a.token_ids == b.token_ids for a, b in zip(res_off.samples, res_on.samples)]
                if not all(same):
                    raise SystemExit(f"capture on/off produced different samples at step {step}")
                rows += len(res_on.samples)
        ray.get(worker.shutdown.remote())
        ledger.close()
    finally:
        ray.shutdown()
        shutil.rmtree(run_dir, ignore_errors=True)
    med_off, med_on = statistics.median(t_off), statistics.median(t_on)
    calls_per_step = rows / len(t_on)
    print(f"[smoke] golden={args.golden} steps={args.steps} repeats={args.repeats} sink={args.sink_dataplane} "
          f"calls/step={calls_per_step:.0f} max_new_tokens={spec['rollout']['max_new_tokens']}")
    print(f"capture off: generation {1e3 * med_off:8.1f} ms/step median ({1e3 * min(t_off):.1f} best)")
    print(f"capture on : generation {1e3 * med_on:8.1f} ms/step median ({1e3 * min(t_on):.1f} best)  "
          f"[{1e3 * (med_on - med_off) / calls_per_step:.2f} ms overhead per call]")
    print(f"ratio on/off: median {med_off / med_on:.3f}  best {min(t_off) / min(t_on):.3f}  "
          f"paired median {_paired(t_off, t_on):.3f}  (goal >= 0.95)")


def _paired(offs: list[float], ons: list[float]) -> float:
    """Median of the per-pair ratios off/on (each pair ran back to back, so a
    burst of background load shifts both of its timings, not the statistic)."""
    return statistics.median(a / b for a, b in zip(offs, ons))


class _InProcess:
    """A RolloutWorker called in this process (phase timers see both sides);
    `.generate.remote(batch)` returns an object ref, as the actor's would."""

    def __init__(self, worker: object):
        import asyncio

        import ray

        class _Method:
            def remote(self, requests: list) -> object:
                return ray.put(asyncio.run(worker.generate(requests)))  # type: ignore[attr-defined]

        self.generate = _Method()


def phases(args: argparse.Namespace) -> None:
    """Where the smoke workload's capture time goes: the same driver and worker
    code with the worker in this process, each capture phase timed per step."""
    import functools
    import os

    import ray

    from harness.capture import finalize as finalize_mod
    from harness.capture import receipt as receipt_mod
    from harness.capture import sink as sink_mod
    from harness.capture.sink import capture_config_from_spec
    from harness.grpo import rollouts
    from harness.rollout.worker import RolloutWorker
    from harness.spec.load import load_spec

    spent: dict[str, float] = {}

    def timed(owner: object, name: str, label: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def wrapper(*a: object, **k: object) -> object:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t

        setattr(owner, name, wrapper)

    for owner, name, label in [
        (CaptureAdmitter, "admit_many", "driver: admit_many (per turn)"),
        (sink_mod.CaptureSink, "begin_requests", "engine: begin_requests"),
        (sink_mod.CaptureSink, "_prepare", "engine: build rows + records"),
        (sink_mod.CaptureSink, "_stage", "engine: stage transaction (fsync)"),
        (sink_mod.CaptureSink, "_commit", "engine: ledger transaction"),
        (receipt_mod, "build_receipts", "driver: build_receipts"),
        (finalize_mod, "finalize_group", "driver: finalize_group"),
    ]:
        timed(owner, name, label)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    spec = load_spec(args.golden, ("capture.enabled=true",))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    run_dir = Path(tempfile.mkdtemp(prefix="capture_bench_phases_", dir=args.dir))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        name = f"dataplane-phases-{os.getpid()}"
        client, ledger, tokenizer, admitter, loader, env = _capture_parts(spec, run_dir, name)
        worker = RolloutWorker(spec, 0, 0, str(run_dir),
                               capture_config=capture_config_from_spec(spec, run_dir, dataplane_actor=name))
        engine = _InProcess(worker)
        on = rollouts.RolloutDriver(spec, [engine], tokenizer, env, (admitter, ledger, client))
        off = rollouts.RolloutDriver(spec, [engine], tokenizer, env, None)
        batches = [loader.next_batch() for _ in range(args.steps)]
        on.run_attempt(batches[0], 0, 1)
        off.run_attempt(batches[0], 0, 1)
        spent.clear()
        t_off: list[float] = []
        t_on: list[float] = []
        for rep in range(args.repeats):
            for step, prompts in enumerate(batches, start=1):
                t = time.perf_counter()
                off.run_attempt(prompts, step, rep + 1)
                t_off.append(time.perf_counter() - t)
                t = time.perf_counter()
                on.run_attempt(prompts, step, rep + 1)
                t_on.append(time.perf_counter() - t)
        worker.shutdown()
        ledger.close()
        client.close()
    finally:
        ray.shutdown()
        shutil.rmtree(run_dir, ignore_errors=True)
    n = len(t_on)
    print(f"[phases] golden={args.golden} steps={args.steps} repeats={args.repeats} (worker in this process)")
    print(f"step median: capture off {1e3 * statistics.median(t_off):.1f} ms, on {1e3 * statistics.median(t_on):.1f} ms"
          f"  paired ratio {_paired(t_off, t_on):.3f}")
    for label, total in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {label:36s} {1e3 * total / n:6.2f} ms/step (mean)")
    print(f"  {'sum of the capture phases':36s} {1e3 * sum(spent.values()) / n:6.2f} ms/step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=("synthetic", "smoke", "both", "phases"), default="synthetic",
                    help="phases: the smoke workload with the worker in this process and every capture "
                         "phase timed (where the overhead goes)")
    ap.add_argument("--rollouts", type=int, default=24, help="synthetic: rollouts per run")
    ap.add_argument("--turns", type=int, default=3, help="synthetic: calls per rollout")
    ap.add_argument("--tokens", type=int, default=32, help="synthetic: generated tokens per call")
    ap.add_argument("--golden", default="qwen3_moe_tiny_smoke", help="smoke: the (single-turn) golden workload")
    ap.add_argument("--steps", type=int, default=6, help="smoke: steps (prompt batches) per repeat")
    ap.add_argument("--sink-dataplane", choices=("run", "actor", "path"), default="run",
                    help="smoke: the engine owner's sink as a run configures it (the data-plane actor's client, "
                         "staging through a local connection on the actor's node), forced through the actor "
                         "(one round trip per batch), or on the SQLite file directly")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the SQLite files go (default: a temp dir)")
    args = ap.parse_args()
    if args.workload in ("synthetic", "both"):
        synthetic(args)
    if args.workload in ("smoke", "both"):
        smoke(args)
    if args.workload == "phases":
        phases(args)


if __name__ == "__main__":
    main()
