"""The official vLLM build on one GPU against the native engine and transformers, on the same weights.

One run on a GPU machine (``ci/gpu``'s wheels installed), medium model of
``qwen3_moe_medium_vllm`` (step-0 weights of its seed), greedy requests:

1. native engine on cuda: tokens and tokens/s;
2. vLLM sync ``LLM`` in this process (TP 1) with the trace rollout profiler:
   tokens, tokens/s, and the pid proof (profiler trace header pid == this
   process == the vLLM worker's pid);
3. vLLM ``AsyncLLM`` (engine core + GPU worker in their own process) with the
   profiler built in that worker: tokens, tokens/s, the pid proof (trace
   header pid == worker pid != this process), then a CUDA IPC refit to the
   weights of another seed and greedy tokens against the native engine on
   those weights;
4. transformers ``generate`` (``Qwen3MoeForCausalLM`` from the same HF
   directory vLLM loaded): tokens and tokens/s.

Token comparisons report identical requests and the first difference.
Writes ``--out`` (JSON) after every arm (a run cut off by its time limit
keeps what it measured) and prints a summary.

    python3 benches/vllm_gpu_bench.py --out /tmp/vllm_gpu_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import torch

TRACE = "harness.profiler.trace.TraceRolloutProfiler"


def _requests(n: int, new_tokens: int) -> list[dict]:
    return [{"request_id": f"r{i}", "prompt_ids": [(7 * i + j) % 200 + 1 for j in range(16)],
             "max_new_tokens": new_tokens, "seed": i, "temperature": 0.0, "top_p": 1.0} for i in range(n)]


def _timed(generate, reqs, repeat: int) -> tuple[list[list[int]], float, list[float]]:
    generate(reqs)  # warm-up (Triton JIT, allocator)
    times, out = [], None
    for _ in range(repeat):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = generate(reqs)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    tokens = [list(r["output_ids"]) for r in out]
    best = sorted(times)[len(times) // 2]
    return tokens, sum(len(t) for t in tokens) / best, times


def compare(a: list[list[int]], b: list[list[int]]) -> dict:
    """Identical sequences and the first difference (request, position, tokens)."""
    same = sum(x == y for x, y in zip(a, b))
    first = None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            pos = next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            first = {"request": i, "position": pos, "a": x[pos:pos + 4], "b": y[pos:pos + 4],
                     "len_a": len(x), "len_b": len(y)}
            break
    return {"identical": same, "of": len(a), "first_difference": first}


def _trace_pids(trace_dir: Path) -> dict[str, int]:
    pids = {}
    for path in sorted(trace_dir.rglob("*.trace.jsonl")):
        with path.open() as fh:
            header = json.loads(fh.readline())
        pids[path.name] = int(header.get("pid", -1))
    return pids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="qwen3_moe_medium_vllm")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--arms", default="native,sync,async,hf")
    ap.add_argument("--out", default="vllm_gpu_bench.json")
    args = ap.parse_args()
    from harness.plugins.loader import ROLLOUT_PROFILER_ENV
    from harness.refit.zmq_stream import ipc_address, send_weights_zmq
    from harness.rollout.engine_worker import configure_determinism, initial_weights, resolve_eos_token_id
    from harness.rollout.native.engine import Engine
    from harness.rollout.vllm.engine import VllmEngineProcesses, VllmEngineWorker
    from harness.spec.load import load_spec

    arms = args.arms.split(",")
    configure_determinism()
    spec = load_spec(args.workload).to_dict()
    spec["rollout"] = dict(spec["rollout"], max_batch_size=max(args.batch, 1))
    reqs = _requests(args.batch, args.new_tokens)
    report: dict = {"workload": args.workload, "batch": args.batch, "new_tokens": args.new_tokens,
                    "gpu": torch.cuda.get_device_name(0), "owner_pid": os.getpid()}
    t = time.perf_counter()
    weights = initial_weights(spec)
    report["weights_build_s"] = time.perf_counter() - t
    eos = resolve_eos_token_id(spec)
    native = Engine(spec["model"], weights, device="cuda", eos_token_id=eos, max_batch_size=args.batch)
    tokens: dict[str, list[list[int]]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="vllm-gpu-bench-"))

    def save() -> None:  # after every arm: a run cut off by its time limit keeps what it measured
        for arm in ("sync", "async", "hf"):
            if arm in tokens and "native" in tokens:
                report[f"{arm}_vs_native"] = compare(tokens["native"], tokens[arm])
                report[arm]["speedup_vs_native"] = report[arm]["tokens_per_s"] / report["native"]["tokens_per_s"]
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))

    def record(arm: str, out) -> None:
        tokens[arm], tps, times = out
        report[arm] = {**report.get(arm, {}), "tokens_per_s": tps, "times_s": times}
        print(f"{arm:7s} {tps:9.1f} tok/s  runs {[round(x, 3) for x in times]}", flush=True)
        save()

    if "native" in arms:
        record("native", _timed(native.generate, reqs, args.repeat))

    if "sync" in arms:
        os.environ.update({ROLLOUT_PROFILER_ENV: TRACE, "HARNESS_TRACE_DIR": str(tmp / "sync")})
        t = time.perf_counter()
        worker = VllmEngineWorker(dict(spec, rollout=dict(spec["rollout"], **{"async": False})), profiler_rank=0,
                                  work_dir=str(tmp / "sync"), profiler_class_path=TRACE)
        worker.end_engine_initialization()
        report["sync"] = {"init_s": time.perf_counter() - t}
        try:
            worker.begin_rollout(1)
            record("sync", _timed(worker.generate, reqs, args.repeat))
            worker.finish_rollout()
            report["sync"]["worker_pids"] = worker.engine_pids()
        finally:
            worker.close_profiler()
            worker.shutdown_engine()
        report["sync"]["trace_pids"] = _trace_pids(tmp / "sync")
        report["sync"]["pid_proof"] = (set(report["sync"]["trace_pids"].values()) == {os.getpid()}
                                       and report["sync"]["worker_pids"] == [os.getpid()])
        save()

    if "async" in arms:
        os.environ.update({ROLLOUT_PROFILER_ENV: TRACE, "HARNESS_TRACE_DIR": str(tmp / "async")})
        t = time.perf_counter()
        procs = VllmEngineProcesses.start(dict(spec, rollout=dict(spec["rollout"], **{"async": True})), rank_prefix=0,
                                          label="bench-async", work_dir=str(tmp / "async"), profiler_class_path=TRACE)
        procs.call("end_engine_initialization")
        report["async"] = {"init_s": time.perf_counter() - t}
        try:
            procs.call("begin_rollout", 1)
            record("async", _timed(lambda r: procs.call("generate", r)[0], reqs, args.repeat))
            procs.call("finish_rollout")
            worker_pids = procs.call("pid")
            report["async"]["worker_pids"] = worker_pids
            profiler_pids = procs.engine.rpc("rollout_profiler_pid")
            report["async"]["profiler_pids"] = profiler_pids
            # CUDA IPC refit to another seed's weights; then greedy tokens against native on them
            new = {n: w.cuda() for n, w in initial_weights(dict(spec, seed=int(spec["seed"]) + 1)).items()}
            address = ipc_address(str(tmp), "bench-refit")
            sent: dict = {}

            def send() -> None:
                sent["stats"] = send_weights_zmq(new.items(), address=address, timeout_ms=300_000,
                                                 buffer_size_bytes=int(spec["rollout"]["refit"]["buffer_size_bytes"]),
                                                 staging_device="cuda")

            sender = threading.Thread(target=send)
            t = time.perf_counter()
            sender.start()
            version = procs.call_each("receive_weights_zmq", [{"address": address, "timeout_ms": 300_000}])
            sender.join()
            report["async"]["refit_s"] = time.perf_counter() - t
            report["async"]["refit_version"] = version
            report["async"]["refit_groups"] = sent["stats"].groups
            after = [list(r["output_ids"]) for r in procs.call("generate", reqs)[0]]
            native.load_weights(new.items())
            native_after = [list(r["output_ids"]) for r in native.generate(reqs)]
            report["async_after_refit_vs_native"] = compare(native_after, after)
            report["async_after_refit_differs_from_before"] = after != tokens["async"]
            save()
            native.load_weights(weights.items())
        finally:
            procs.call("close_profiler")
            procs.stop()
        report["async"]["trace_pids"] = _trace_pids(tmp / "async")
        report["async"]["pid_proof"] = (set(report["async"]["trace_pids"].values()) == set(worker_pids)
                                        and list(profiler_pids) == list(worker_pids)
                                        and os.getpid() not in worker_pids)
        save()

    if "hf" in arms:
        from transformers import AutoModelForCausalLM

        model_dir = next(p for p in (tmp / "sync" / "model", tmp / "async" / "model") if p.exists())
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).cuda().eval()
        ids = torch.tensor([r["prompt_ids"] for r in reqs], device="cuda")

        def hf_generate(_reqs):
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                                     do_sample=False, eos_token_id=eos, pad_token_id=0)
            result = []
            for row in out[:, ids.shape[1]:].tolist():
                cut = row.index(eos) + 1 if eos is not None and eos in row else len(row)
                result.append({"output_ids": row[:cut]})
            return result

        record("hf", _timed(hf_generate, reqs, args.repeat))
        del model

    save()
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
