"""Rollout engine throughput: native engine tokens/s vs baselines on the same weights.

Baselines: transformers ``generate`` (greedy, KV cache) when transformers is
installed, and always the reference model re-run on the full sequence per
token (no KV cache). The native engine is timed twice: as configured (batched
decode, the default) and request by request (``batched_decode=False``, the
same tokens). Every contender runs ``--repeat`` times, interleaved round by
round so load on a shared machine hits them alike; the median is reported.
Prints measured tokens/s and ratios; not a test.

    python3 benches/rollout_bench.py [--batch 8] [--new 32] [--config tiny|medium] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model, hf_fused_state_dict
from harness.rollout.native.engine import Engine

CONFIGS = {
    "tiny": ModelConfig(layers=4, hidden=64, heads=8, kv_heads=2, head_dim=16, experts=8, top_k=2,
                        moe_intermediate=32, vocab=256),
    "medium": ModelConfig(layers=8, hidden=512, heads=8, kv_heads=4, head_dim=64, experts=16, top_k=4,
                          moe_intermediate=256, vocab=4096, max_position=1024),
}


def _prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (length,), generator=gen).tolist() for _ in range(batch)]


def engine_runner(cfg, weights, prompts, new_tokens, **engine_kw) -> tuple[Callable[[], float], list]:
    """A callable timing one ``generate`` of every prompt (tokens/s), and the first run's tokens."""
    engine = Engine(cfg, weights, max_batch_size=len(prompts), **engine_kw)
    reqs = [dict(request_id=i, prompt_ids=p, max_new_tokens=new_tokens, seed=i, temperature=0.0, top_p=1.0)
            for i, p in enumerate(prompts)]
    engine.generate(reqs[:1])  # warm-up
    outputs: list = []

    def run() -> float:
        start = time.perf_counter()
        out = engine.generate(reqs)
        elapsed = time.perf_counter() - start
        if not outputs:
            outputs.extend(r["output_ids"] for r in out)
        return sum(len(r["output_ids"]) for r in out) / elapsed

    return run, outputs


def recompute_runner(model, prompts, new_tokens) -> Callable[[], float]:
    @torch.no_grad()
    def run() -> float:
        ids = torch.tensor(prompts)
        start = time.perf_counter()
        for _ in range(new_tokens):
            logits, _ = model(ids)
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return len(prompts) * new_tokens / (time.perf_counter() - start)

    return run


def transformers_runner(cfg, weights, prompts, new_tokens) -> Callable[[], float] | None:
    try:
        import transformers
    except ImportError:
        return None
    hf_cfg = transformers.Qwen3MoeConfig(**cfg.to_hf_dict())
    model = transformers.Qwen3MoeForCausalLM(hf_cfg).eval()
    model.load_state_dict(hf_fused_state_dict(weights, cfg), strict=False)
    ids = torch.tensor(prompts)
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, use_cache=True)
    model.generate(ids[:1], **kw)  # warm-up

    def run() -> float:
        start = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        return len(prompts) * new_tokens / (time.perf_counter() - start)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per contender (median reported)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = CONFIGS[args.config]
    model = build_reference_model(cfg, seed=0).eval()
    weights = {n: t.detach() for n, t in model.state_dict().items()}
    prompts = _prompts(args.batch, args.prompt, cfg.vocab)
    native, native_tokens = engine_runner(cfg, weights, prompts, args.new)
    per_request, per_request_tokens = engine_runner(cfg, weights, prompts, args.new, batched_decode=False)
    runners: dict[str, Callable[[], float]] = {
        "native": native, "per_request": per_request, "recompute": recompute_runner(model, prompts, args.new)}
    hf = transformers_runner(cfg, weights, prompts, args.new)
    if hf is not None:
        runners["transformers"] = hf
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.repeat):
        for name, run in runners.items():
            samples[name].append(run())
    tps = {name: statistics.median(values) for name, values in samples.items()}
    spread = {name: (min(v), max(v)) for name, v in samples.items()}
    print(f"config={args.config} batch={args.batch} prompt={args.prompt} new={args.new} threads={args.threads} "
          f"repeat={args.repeat} (median tok/s, [min, max])")

    def line(label: str, name: str, extra: str = "") -> None:
        lo, hi = spread[name]
        print(f"{label:<28}{tps[name]:9.1f} tok/s  [{lo:7.1f}, {hi:7.1f}]{extra}")

    line("native engine", "native")
    line("native, request by request", "per_request",
         f"   batched/per-request = {tps['native'] / tps['per_request']:.2f}x, same tokens: "
         f"{native_tokens == per_request_tokens}")
    line("reference recompute", "recompute", f"   native/recompute = {tps['native'] / tps['recompute']:.2f}x")
    if hf is None:
        print("transformers generate       not installed (pip install transformers to compare)")
    else:
        ratio = tps["native"] / tps["transformers"]
        line("transformers generate", "transformers", f"   native/transformers = {ratio:.2f}x")


if __name__ == "__main__":
    main()
