"""The native stack on one GPU against transformers, on the same weights (issue 20's shapes).

Config: 8 layers, hidden 1024, 16 heads / 4 KV heads of 128, 64 experts top-8,
expert FFN 384, vocabulary 4096 (the medium golden's model with a 4096 vocabulary).

1. Generation, greedy, ``--prompt`` tokens, ``--new-tokens`` new, at each ``--batches``:
   the native engine per ``--kernels`` arm (``decode_kernels``: ``invariant`` and/or
   ``standard``, the latter only up to ``--standard-max-batch``; the start-up probe's
   verdict is printed), with ``--per-request`` at the first batch size also the requests
   alone (invariant: each in a ``max_batch_size`` 1 engine; standard: request-by-request
   decode) and whether their tokens and logprobs (greedy, then temperature/top-p samples)
   are equal, and transformers ``generate`` (unless ``--no-hf``); tokens/s, the ratio of
   the first arm, and identical sequences (native vs transformers). ``--cuda-graphs``: the
   invariant arm's batched engine replays its decode steps as CUDA graphs
   (``Engine(cuda_graphs=True)``); the engines alone stay eager, so ``equals_alone`` then
   also compares replayed steps with eager ones.
2. Forward+backward of the reference model vs transformers' ``Qwen3MoeForCausalLM``,
   ``--fb-batch`` x ``--fb-seq`` tokens, per ``--dtypes`` (fp32, bf16; both MoEs as grouped
   GEMMs on cuda, the default), per ``--expert-layouts`` of the reference model (``stacked``,
   the default: its experts as two ``[E, ...]`` parameters a layer, transformers' layout;
   ``per_expert``: a module per expert, the operands stacked per forward; the rows of a
   second layout are ``fwd_bwd_<dtype>_<layout>``), and with ``--loop-fp32`` an fp32 arm on the per-expert loop
   (``HARNESS_GROUPED_FP32=0``, the opt-out): median seconds, ratio. Each step starts from
   no gradients (``zero_grad(set_to_none=True)``, as a training step does), in both arms.

Prints a summary, writes ``--out`` (JSON). Never a test verdict.

    PYTHONPATH=. python3 benches/native_gpu_bench.py --out /tmp/native_gpu_bench.json
    PYTHONPATH=. python3 benches/native_gpu_bench.py --parts generate --batches 16 64 --per-request \
        --kernels invariant --repeat 1 --out gen.json      # the figures in docs/gpu.md
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import EXPERT_LAYOUTS, build_reference_model, hf_fused_state_dict

CFG = dict(layers=8, hidden=1024, heads=16, kv_heads=4, head_dim=128, experts=64, top_k=8,
           moe_intermediate=384, vocab=4096, max_position=512)


def _sync_time(fn, repeat: int, warm=None) -> tuple[object, list[float]]:
    out = (warm or fn)()  # warm-up
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return out, times


def _hf_model(cfg: ModelConfig, state: dict, dtype: torch.dtype):
    import transformers

    hf = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**cfg.to_hf_dict()))
    if any("gate_up_proj" in k for k in hf.state_dict()):
        state = hf_fused_state_dict(state, cfg)
    hf.load_state_dict(state)
    return hf.to(device="cuda", dtype=dtype)


class _Messages(logging.Handler):
    """Collects the probe's log messages (its verdict's reason)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _native_arm(cfg: ModelConfig, state: dict, reqs: list, args, kernels: str, per_request: bool) -> dict:
    """One native engine (``decode_kernels=kernels``): start, probe verdict, tok/s, tokens;
    ``per_request``: the same requests alone (invariant: a batch of one each; standard:
    request-by-request decode) and whether every token and logprob is equal."""
    from harness.rollout.native.engine import Engine

    batch = len(reqs)
    row: dict = {}
    messages = _Messages()
    probe_log = logging.getLogger("harness.rollout.native.probe")
    probe_log.addHandler(messages)
    t = time.perf_counter()
    graphs = args.cuda_graphs and kernels == "invariant"  # the solo engines below stay eager
    engine = Engine(cfg, state, device="cuda", max_batch_size=batch, decode_kernels=kernels, cuda_graphs=graphs)
    row["cuda_graphs"] = graphs
    row["engine_start_s"] = time.perf_counter() - t
    probe_log.removeHandler(messages)
    print(f"  [{kernels} b{batch}] engine started in {row['engine_start_s']:.1f} s: {messages.messages}", flush=True)
    row["batched_decode"] = engine.batched_decode
    row["batched_sampling"] = engine.scheduler.batched_sampling
    row["grouped_prefill"] = engine.forward.grouped_prefill
    row["probe_messages"] = messages.messages
    layer = engine.packed.layers[0]
    row["modes"] = [layer.qkv_proj.mode, layer.o_proj.mode, layer.router_proj.mode, layer.experts.mode]
    total = batch * args.new_tokens
    short = [dict(r, max_new_tokens=2) for r in reqs]  # warm-up: allocations, kernels; not the whole run
    out, times = _sync_time(partial(engine.generate, reqs), args.repeat, partial(engine.generate, short))
    row["tok_s"] = total / statistics.median(times)
    row["generate_s"] = times
    row["tokens"] = [list(r["output_ids"]) for r in out]
    print(f"  [{kernels} b{batch}] {row['tok_s']:.1f} tok/s (generate {times} s)", flush=True)
    if args.profile_decode and kernels == "invariant":  # a short run: profiling a whole one overran 80 s
        row["top_ops"] = _top_ops(partial(engine.generate, [dict(r, max_new_tokens=4) for r in reqs]), 20)
    if per_request:
        if kernels == "invariant":
            solo = Engine(cfg, state, device="cuda", max_batch_size=1, decode_kernels=kernels, cuda_graphs=False)
        else:
            solo = Engine(cfg, state, device="cuda", max_batch_size=batch, batched_decode=False, cuda_graphs=False)
        t = time.perf_counter()
        alone = [solo.generate([r])[0] for r in reqs] if kernels == "invariant" else solo.generate(reqs)
        torch.cuda.synchronize()
        row["alone_tok_s"] = total / (time.perf_counter() - t)
        row["equals_alone"] = [list(r["output_ids"]) for r in alone] == row["tokens"]
        row["logprobs_equal_alone"] = [r["logprobs"] for r in alone] == [r["logprobs"] for r in out]
        print(f"  [{kernels} b{batch}] alone {row['alone_tok_s']:.1f} tok/s, equal {row['equals_alone']}", flush=True)
        sampled = [dict(r, temperature=0.8, top_p=(1.0, 0.9)[j % 2], seed=100 + j, max_new_tokens=8)
                   for j, r in enumerate(reqs)]
        with_temp = engine.generate(sampled)
        alone_temp = [solo.generate([r])[0] for r in sampled] if kernels == "invariant" else solo.generate(sampled)
        row["sampled_equals_alone"] = with_temp == alone_temp
    del engine
    return row


def _generate_one(cfg: ModelConfig, state: dict, hf, prompts: torch.Tensor, args, per_request: bool) -> dict:
    batch = prompts.shape[0]
    reqs = [{"request_id": f"r{j}", "prompt_ids": prompts[j].tolist(), "max_new_tokens": args.new_tokens,
             "seed": j, "temperature": 0.0, "top_p": 1.0} for j in range(batch)]
    row: dict = {}
    for kernels in args.kernels:
        if kernels == "standard" and batch > args.standard_max_batch:
            continue  # row-local decode: slow at large batches
        try:
            arm = _native_arm(cfg, state, reqs, args, kernels, per_request)
        except ValueError as exc:  # the probe refused: report it, go on
            row[kernels] = {"error": str(exc)}
            print(f"generate batch {batch} native {kernels}: {exc}", flush=True)
            continue
        print(f"generate batch {batch} native {kernels}: {arm['tok_s']:.1f} tok/s "
              f"{ {k: v for k, v in arm.items() if k not in ('tokens', 'top_ops')} }", flush=True)
        row[kernels] = arm
        torch.cuda.empty_cache()
    first = row.get(args.kernels[0], {})
    if "tokens" not in first:
        return row
    native_tokens = first["tokens"]
    row["native_tok_s"] = first["tok_s"]
    for arm in row.values():
        if isinstance(arm, dict):
            arm.pop("tokens", None)
    if hf is None:
        return row
    total = batch * args.new_tokens
    ids = prompts.cuda()

    def hf_generate():
        with torch.no_grad():
            return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                               min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)

    try:  # transformers' batched-mm experts ran out of memory at batch 64 on one H200: keep native's figure
        out, times = _sync_time(hf_generate, args.repeat)
    except torch.OutOfMemoryError as exc:
        row["hf_error"] = repr(exc)[:200]
        torch.cuda.empty_cache()
        print(f"generate batch {batch}: native {row['native_tok_s']:.1f} tok/s; transformers: {row['hf_error']}")
        return row
    hf_tokens = out[:, args.prompt:].tolist()
    row["hf_tok_s"] = total / statistics.median(times)
    row["native_over_hf"] = row["native_tok_s"] / row["hf_tok_s"]
    row["identical_vs_hf"] = sum(a == b for a, b in zip(native_tokens, hf_tokens))
    print(f"generate batch {batch}: native ({args.kernels[0]}) {row['native_tok_s']:.1f} tok/s, transformers "
          f"{row['hf_tok_s']:.1f} tok/s, ratio {row['native_over_hf']:.2f}; identical "
          f"{row['identical_vs_hf']}/{batch}", flush=True)
    return row


def generation(cfg: ModelConfig, state: dict, args, report: dict) -> None:
    """Per ``--gen-dtypes`` (float32: ``generate_b{N}``; others ``generate_b{N}_{dtype}``, the
    engine and transformers on the same weights rounded to that dtype)."""
    for name in args.gen_dtypes:
        dtype = getattr(torch, name)
        dcfg = dataclasses.replace(cfg, dtype=name)
        dstate = {k: v.to(dtype) for k, v in state.items()}
        hf = None if args.no_hf else _hf_model(dcfg, dstate, dtype).eval()
        gen = torch.Generator().manual_seed(0)
        suffix = "" if name == "float32" else f"_{name}"
        for i, batch in enumerate(args.batches):
            prompts = torch.randint(1, cfg.vocab, (batch, args.prompt), generator=gen)
            report[f"generate_b{batch}{suffix}"] = _generate_one(dcfg, dstate, hf, prompts, args,
                                                                 args.per_request and i == 0)
            torch.cuda.empty_cache()
        del hf


def _top_ops(fn, n: int = 12) -> list[tuple[str, int, float, float]]:
    """(op, calls, self CUDA ms, self CPU ms) of one profiled ``fn()``, by self CUDA time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -getattr(e, "self_device_time_total", 0.0))
    return [(e.key, e.count, getattr(e, "self_device_time_total", 0.0) / 1e3, e.self_cpu_time_total / 1e3)
            for e in rows[:n]]


def _fwd_bwd_one(cfg: ModelConfig, state: dict, ids: torch.Tensor, dtype: torch.dtype, repeat: int,
                 profile: bool = False, layout: str = "stacked") -> dict:
    row: dict = {"expert_layout": layout}
    ours = build_reference_model(cfg, seed=0, expert_layout=layout)
    mine = ours.state_dict()  # the same weights as transformers' arm, in either layout
    row["same_weights"] = list(mine) == list(state) and all(torch.equal(mine[k], v) for k, v in state.items())
    ours = ours.to(device="cuda", dtype=dtype)

    def step_ours():
        ours.zero_grad(set_to_none=True)
        logits, _ = ours(ids)
        torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, cfg.vocab),
                                          ids[:, 1:].reshape(-1)).backward()

    hf = _hf_model(cfg, state, dtype)

    def step_hf():
        hf.zero_grad(set_to_none=True)
        hf(input_ids=ids, labels=ids).loss.backward()

    for arm, fn in (("native", step_ours), ("hf", step_hf)):
        try:
            _, times = _sync_time(fn, repeat)
            row[f"{arm}_s"] = statistics.median(times)
            if profile:
                row[f"{arm}_top_ops"] = _top_ops(fn)
        except Exception as exc:  # noqa: BLE001 - a bench reports, it does not stop
            row[f"{arm}_error"] = repr(exc)[:300]
    if "native_s" in row and "hf_s" in row:
        row["native_over_hf"] = row["native_s"] / row["hf_s"]
    return row


def forward_backward(cfg: ModelConfig, state: dict, args, report: dict) -> None:
    ids = torch.randint(0, cfg.vocab, (args.fb_batch, args.fb_seq), generator=torch.Generator().manual_seed(1))
    ids = ids.cuda()
    for name in args.dtypes:
        for i, layout in enumerate(args.expert_layouts):
            row = _fwd_bwd_one(cfg, state, ids, getattr(torch, name), args.repeat, args.profile, layout)
            key = f"fwd_bwd_{name}" if i == 0 else f"fwd_bwd_{name}_{layout}"
            report[key] = row
            print(f"{key} {args.fb_batch}x{args.fb_seq}: {row}", flush=True)
            torch.cuda.empty_cache()
    if args.loop_fp32:  # the opt-out: the reference model's fp32 MoE as the per-expert loop
        from harness.model.grouped import GROUPED_FP32_ENV

        with _env(GROUPED_FP32_ENV, "0"):
            row = _fwd_bwd_one(cfg, state, ids, torch.float32, args.repeat, args.profile, args.expert_layouts[0])
        report["fwd_bwd_float32_loop"] = row
        print(f"fwd+bwd float32 loop {args.fb_batch}x{args.fb_seq}: {row}", flush=True)


@contextlib.contextmanager
def _env(name: str, value: str):
    """``$name`` set to ``value`` inside the block, as it was afterwards."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name)
        else:
            os.environ[name] = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--per-request", action="store_true",
                    help="first batch size: the requests alone too, and whether their tokens are equal")
    ap.add_argument("--kernels", nargs="+", default=["invariant", "standard"], choices=["invariant", "standard"],
                    help="native decode_kernels arms; the first one's figure is the ratio's")
    ap.add_argument("--standard-max-batch", type=int, default=16, help="skip the standard arm above this batch")
    ap.add_argument("--loop-fp32", action="store_true", help="fwd+bwd: an fp32 arm on the per-expert loop")
    ap.add_argument("--no-hf", action="store_true", help="generation: no transformers arm")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="generation: the invariant arm's batched engine replays its decode steps as CUDA graphs "
                         "(the engines it is compared with alone stay eager)")
    ap.add_argument("--gen-dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"],
                    help="generation: model dtypes (bfloat16: invariant kernels with fp32 accumulation)")
    ap.add_argument("--profile-decode", action="store_true", help="generation: top ops of a 4-token invariant run")
    ap.add_argument("--fb-batch", type=int, default=8)
    ap.add_argument("--fb-seq", type=int, default=512)
    ap.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    ap.add_argument("--expert-layouts", nargs="+", default=["stacked"], choices=EXPERT_LAYOUTS,
                    help="fwd+bwd: the reference model's expert layouts; the first one's rows are fwd_bwd_<dtype>")
    ap.add_argument("--parts", default="fwd_bwd,generate")
    ap.add_argument("--profile", action="store_true", help="fwd+bwd: the top operators by GPU time")
    ap.add_argument("--out", default="native_gpu_bench.json")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    cfg = ModelConfig(**CFG)
    state = {k: v.detach() for k, v in build_reference_model(cfg, seed=0).state_dict().items()}
    report: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "config": CFG}
    parts = args.parts.split(",")
    for part in parts:
        {"generate": generation, "fwd_bwd": forward_backward}[part](cfg, state, args, report)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))  # what ran, if cut off later
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
