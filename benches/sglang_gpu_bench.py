"""The real SGLang engine (0.5.17) on one GPU: import and start-up cost, generation beside the
native engine, and refit through SGLang's own weight-update entry points, read back.

One run on a GPU machine with ``ci/gpu/sglang_wheels.sh``'s wheels installed. Steps (each
writes ``--out`` as it ends, so a run cut off keeps what it measured; a failing step records
its error and the later steps that do not need it still run):

1. ``import sglang`` and ``sglang.Engine`` start (seconds), over ``write_hf_dir`` of the
   workload's step-0 weights (seed ``s``);
2. greedy tokens of SGLang and of the native engine on the same weights (identical requests,
   first difference);
3. weights read back: SGLang's per-parameter checksum of the engine as loaded from disk;
4. colocated refit to the weights of seed ``s + 1`` through ``update_weights_from_tensor``
   (cuda tensors, CUDA IPC handles), GB/s; checksum differs from step 3; greedy tokens
   against the native engine on those weights;
5. refit back to seed ``s`` as the harness's flattened buckets (one CUDA IPC handle per
   bucket and dtype, SGLang's ``FlattenedTensorBucket``), GB/s; the checksum must equal
   step 3's bit for bit (the refit loads exactly what a load from disk loads);
6. separate-engine refit to seed ``s + 1`` through SGLang's weight-update group
   (``init_weights_update_group`` + ``update_weights_from_distributed``; this process is
   rank 0 and broadcasts each tensor; ``--group-backend``, default gloo: NCCL refuses two
   ranks on one GPU, and the machines lent here have one), GB/s; the checksum must equal
   step 4's.

    python3 benches/sglang_gpu_bench.py --workload qwen3_moe_tiny_smoke --out /tmp/sglang_gpu_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import threading
import time
import traceback


def _requests(n: int, new_tokens: int) -> list[dict]:
    return [{"request_id": f"r{i}", "prompt_ids": [(7 * i + j) % 200 + 1 for j in range(16)],
             "max_new_tokens": new_tokens, "seed": i, "temperature": 0.0, "top_p": 1.0} for i in range(n)]


def _compare(a: list[list[int]], b: list[list[int]]) -> dict:
    same = sum(x == y for x, y in zip(a, b))
    first = next(({"request": i, "position": next((j for j, (p, q) in enumerate(zip(x, y)) if p != q),
                                                  min(len(x), len(y))), "a": x[:8], "b": y[:8]}
                  for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return {"identical": same, "of": len(a), "first_difference": first}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="qwen3_moe_tiny_smoke")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--group-backend", default="gloo")
    ap.add_argument("--mem-fraction", type=float, default=0.3)
    ap.add_argument("--engine-kwargs", default="{}", help="JSON merged into sglang.Engine's arguments")
    ap.add_argument("--out", default="sglang_gpu_bench.json")
    args = ap.parse_args()
    report: dict = {"workload": args.workload, "steps": {}, "engine_kwargs": json.loads(args.engine_kwargs)}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)

    def step(name, fn):
        t = time.perf_counter()
        try:
            out = fn()
            report["steps"][name] = {"ok": True, "s": round(time.perf_counter() - t, 3), **(out or {})}
        except Exception as exc:  # noqa: BLE001 - a bench records and goes on
            report["steps"][name] = {"ok": False, "s": round(time.perf_counter() - t, 3),
                                     "error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc()[-3000:]}
        print(f"[sglang-bench] {name}: {json.dumps(report['steps'][name])[:1500]}", flush=True)
        save()
        return report["steps"][name]["ok"]

    t = time.perf_counter()
    import torch
    report["import_torch_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    import sglang
    report["import_sglang_s"] = round(time.perf_counter() - t, 3)
    report["versions"] = {"sglang": sglang.__version__, "torch": torch.__version__,
                          "gpu": torch.cuda.get_device_name(0)}
    import transformers
    report["versions"]["transformers"] = transformers.__version__
    save()

    from harness.model.config import ModelConfig
    from harness.refit.flat_bucket import FlattenedBucket, group_by_dtype
    from harness.rollout.engine_worker import configure_determinism, initial_weights, resolve_eos_token_id
    from harness.rollout.native.engine import Engine
    from harness.rollout.sglang.engine import SGLangEngine
    from harness.rollout.vllm.hf_dir import write_hf_dir
    from harness.spec.load import load_spec

    configure_determinism("cuda")
    spec = load_spec(args.workload).to_dict()
    spec["rollout"] = dict(spec["rollout"], max_batch_size=max(args.batch, 1))
    cfg = ModelConfig.from_spec(spec["model"])
    eos = resolve_eos_token_id(spec)
    seed = int(spec["seed"])
    w_a = initial_weights(spec)
    w_b = initial_weights(dict(spec, seed=seed + 1))
    nbytes = sum(t.numel() * t.element_size() for t in w_a.values())
    report["weights"] = {"tensors": len(w_a), "bytes": nbytes}
    tmp = tempfile.mkdtemp(prefix="sglang-bench-")
    write_hf_dir(cfg, os.path.join(tmp, "hf"), w_a, eos_token_id=eos)
    reqs = _requests(args.batch, args.new_tokens)
    st: dict = {}

    def start():
        kwargs = {"dtype": spec["model"]["dtype"], "seed": seed, "mem_fraction_static": args.mem_fraction,
                  **json.loads(args.engine_kwargs)}  # --engine-kwargs may override any of them (dtype too)
        st["engine"] = SGLangEngine(os.path.join(tmp, "hf"), eos_token_id=eos, max_position=cfg.max_position,
                                    **kwargs)
        return {}
    if not step("engine_start", start):
        return
    eng: SGLangEngine = st["engine"]

    def native_tokens(weights):
        native = Engine(spec["model"], weights, device="cuda", eos_token_id=eos, max_batch_size=args.batch)
        return [r["output_ids"] for r in native.generate(reqs)]

    def gen(tag, weights):
        def run():
            t = time.perf_counter()
            out = eng.generate(reqs)
            dt = time.perf_counter() - t
            toks = [r["output_ids"] for r in out]
            st[f"tokens_{tag}"] = toks
            return {"tokens_per_s": round(sum(map(len, toks)) / dt, 1), "first": toks[0][:8],
                    "finish": [r["finish_reason"] for r in out][:4], "logprobs0": out[0]["logprobs"][:3],
                    "vs_native": _compare(toks, native_tokens(weights))}
        return run

    step("generate_a", gen("a", w_a))
    step("checksum_disk_a", lambda: {"engine": st.setdefault("sum_a", eng.weights_checksum())["engine"],
                                     "params": len(st["sum_a"]["tensors"])})

    def refit_ipc():
        named = [(n, t.cuda()) for n, t in w_b.items()]
        torch.cuda.synchronize()
        t = time.perf_counter()
        ok, msg = eng.update_weights_from_tensor(named, weight_version=1)
        dt = time.perf_counter() - t
        assert ok, msg
        st["sum_b"] = eng.weights_checksum()
        return {"gb_per_s": round(nbytes / dt / 1e9, 3), "refit_s": round(dt, 4), "message": msg,
                "engine": st["sum_b"]["engine"], "differs_from_a": st["sum_b"]["engine"] != st["sum_a"]["engine"],
                "version": eng.get_weight_version()}
    if step("refit_ipc_b", refit_ipc):
        step("generate_b", gen("b", w_b))

    def refit_flat():
        per_dtype = group_by_dtype([(n, t.cuda()) for n, t in w_a.items()])
        torch.cuda.synchronize()
        t = time.perf_counter()
        msgs = []
        for _dtype, named in per_dtype:
            ok, msg = eng.update_weights_from_tensor([FlattenedBucket(named).payload()],
                                                     load_format="flattened_bucket", weight_version=2)
            assert ok, msg
            msgs.append(msg)
        dt = time.perf_counter() - t
        back = eng.weights_checksum()
        differing = sorted(k for k, v in back["tensors"].items() if st["sum_a"]["tensors"].get(k) != v)
        return {"gb_per_s": round(nbytes / dt / 1e9, 3), "refit_s": round(dt, 4), "buckets": len(per_dtype),
                "bit_equal_to_disk_load": back["engine"] == st["sum_a"]["engine"], "differing": differing[:10],
                "messages": msgs[:2]}
    step("refit_flattened_a", refit_flat)

    def refit_group():
        from sglang.srt.utils import init_custom_process_group

        port, group = _free_port(), "harness_refit"
        box: dict = {}
        th = threading.Thread(target=lambda: box.update(r=eng.init_weights_update_group(
            "127.0.0.1", port, 1, 2, group, backend=args.group_backend)))
        th.start()
        pg = init_custom_process_group(backend=args.group_backend, init_method=f"tcp://127.0.0.1:{port}",
                                       world_size=2, rank=0, group_name=group)
        th.join()
        assert box["r"][0], box["r"]
        names = list(w_b)
        tensors = [w_b[n].cuda() for n in names]
        torch.cuda.synchronize()
        t = time.perf_counter()
        th = threading.Thread(target=lambda: box.update(u=eng.update_weights_from_distributed(
            names, [str(x.dtype).replace("torch.", "") for x in tensors], [list(x.shape) for x in tensors],
            group_name=group, weight_version=3)))
        th.start()
        for x in tensors:
            torch.distributed.broadcast(x, src=0, group=pg)
        th.join()
        dt = time.perf_counter() - t
        assert box["u"][0], box["u"]
        back = eng.weights_checksum()
        destroy = eng.destroy_weights_update_group(group)
        return {"gb_per_s": round(nbytes / dt / 1e9, 3), "refit_s": round(dt, 4), "backend": args.group_backend,
                "bit_equal_to_ipc_b": back["engine"] == st.get("sum_b", {}).get("engine"),
                "destroy": list(destroy), "version": eng.get_weight_version()}
    step("refit_group_b", refit_group)
    t = time.perf_counter()
    eng.shutdown()
    report["shutdown_s"] = round(time.perf_counter() - t, 3)
    save()


if __name__ == "__main__":
    main()
