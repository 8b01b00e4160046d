"""Policy step time per topology, and native 1-rank fwd+bwd vs transformers.

    python3 benches/policy_step_bench.py [--steps 5] [--layouts tp=1 tp=2 "tp=2,pp=2,cp=2,ep=2"]

Prints measured medians and ratios; never used as a test verdict.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model, hf_fused_state_dict
from harness.parallel.data import shard_for_dp
from harness.policy.synthetic import synthetic_batch
from harness.spec import load_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: suites/ holds the spawn helper
from suites.local_world import spawn_world, with_layout


def _timed_steps(engine, batch, steps):
    shard = shard_for_dp(batch, engine.spec.policy.dp, engine.coords["dp"])
    engine.train(shard)  # warm-up
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        engine.train(shard)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def native_vs_hf(cfg: ModelConfig, iters: int) -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    ours = build_reference_model(cfg, seed=0)
    ids = torch.randint(0, cfg.vocab, (2, 64), generator=torch.Generator().manual_seed(0))

    def step_ours():
        logits, _ = ours(ids)
        torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab), ids[:, 1:].reshape(-1)).backward()

    try:
        import transformers
    except ImportError:
        print("transformers not installed: skipping the native-vs-HF comparison")
        return
    hf = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**cfg.to_hf_dict()))
    sd = ours.state_dict()
    if any("gate_up_proj" in k for k in hf.state_dict()):
        sd = hf_fused_state_dict(sd, cfg)
    hf.load_state_dict(sd)

    def step_hf():
        hf(input_ids=ids, labels=ids).loss.backward()

    res = {}
    for name, fn in (("native", step_ours), ("transformers", step_hf)):
        fn()
        ts = []
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        res[name] = statistics.median(ts)
        print(f"{name:13s} fwd+bwd median {res[name] * 1e3:8.2f} ms")
    print(f"native / transformers ratio: {res['native'] / res['transformers']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layouts", nargs="*", default=["tp=1", "tp=2", "tp=2,pp=2,cp=2,ep=2"])
    args = ap.parse_args()
    spec = load_spec("goldens/qwen3_moe_tiny_tp2pp2cp2ep2/workload.yaml")
    base = with_layout(spec, tp=1, pp=1, cp=1, ep=1, etp=1, dp=1)
    native_vs_hf(ModelConfig.from_spec(base), args.steps * 4)
    batch = synthetic_batch(base, 8, seed=0)
    one = None
    for text in args.layouts:
        layout = dict(kv.split("=") for kv in text.split(","))
        s = with_layout(base, **{k: int(v) for k, v in layout.items()})
        med = max(spawn_world(s, _timed_steps, batch, args.steps))
        one = med if one is None else one
        print(f"{text:24s} step median (slowest rank) {med * 1e3:8.1f} ms   ratio to first layout {med / one:.2f}")


if __name__ == "__main__":
    main()
