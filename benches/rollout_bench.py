"""Rollout engine throughput: native engine tokens/s vs baselines on the same weights.

Baselines: transformers ``generate`` (greedy, KV cache) when transformers is
installed, and always the reference model re-run on the full sequence per
token (no KV cache). Prints measured tokens/s and ratios; not a test.

    python3 benches/rollout_bench.py [--batch 8] [--new 32] [--config tiny|medium]
"""

from __future__ import annotations

import argparse
import time

import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model, hf_fused_state_dict
from harness.rollout.engine import Engine

CONFIGS = {
    "tiny": ModelConfig(layers=4, hidden=64, heads=8, kv_heads=2, head_dim=16, experts=8, top_k=2,
                        moe_intermediate=32, vocab=256),
    "medium": ModelConfig(layers=8, hidden=512, heads=8, kv_heads=4, head_dim=64, experts=16, top_k=4,
                          moe_intermediate=256, vocab=4096, max_position=1024),
}


def _prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (length,), generator=gen).tolist() for _ in range(batch)]


def bench_engine(cfg, weights, prompts, new_tokens) -> tuple[float, list[list[int]]]:
    engine = Engine(cfg, weights, max_batch_size=len(prompts))
    reqs = [dict(request_id=i, prompt_ids=p, max_new_tokens=new_tokens, seed=i, temperature=0.0, top_p=1.0)
            for i, p in enumerate(prompts)]
    engine.generate(reqs[:1])  # warm-up
    start = time.perf_counter()
    out = engine.generate(reqs)
    elapsed = time.perf_counter() - start
    return sum(len(r["output_ids"]) for r in out) / elapsed, [r["output_ids"] for r in out]


@torch.no_grad()
def bench_recompute(model, prompts, new_tokens) -> float:
    ids = torch.tensor(prompts)
    start = time.perf_counter()
    for _ in range(new_tokens):
        logits, _ = model(ids)
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return len(prompts) * new_tokens / (time.perf_counter() - start)


def bench_transformers(cfg, weights, prompts, new_tokens) -> float | None:
    try:
        import transformers
    except ImportError:
        return None
    hf_cfg = transformers.Qwen3MoeConfig(**cfg.to_hf_dict())
    model = transformers.Qwen3MoeForCausalLM(hf_cfg).eval()
    model.load_state_dict(hf_fused_state_dict(weights, cfg), strict=False)
    ids = torch.tensor(prompts)
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, use_cache=True)
    model.generate(ids[:1], **kw)
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    return len(prompts) * new_tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = CONFIGS[args.config]
    model = build_reference_model(cfg, seed=0).eval()
    weights = {n: t.detach() for n, t in model.state_dict().items()}
    prompts = _prompts(args.batch, args.prompt, cfg.vocab)
    native, _ = bench_engine(cfg, weights, prompts, args.new)
    recompute = bench_recompute(model, prompts, args.new)
    print(f"config={args.config} batch={args.batch} prompt={args.prompt} new={args.new} threads={args.threads}")
    print(f"native engine          {native:9.1f} tok/s")
    print(f"reference recompute    {recompute:9.1f} tok/s   native/recompute = {native / recompute:.2f}x")
    hf = bench_transformers(cfg, weights, prompts, args.new)
    if hf is None:
        print("transformers generate  not installed (pip install transformers to compare)")
    else:
        print(f"transformers generate  {hf:9.1f} tok/s   native/transformers = {native / hf:.2f}x")


if __name__ == "__main__":
    main()
