"""The per-environment smoke check ``golden doctor`` runs inside each built environment.

``python -m harness.workerenv.smoke BACKEND`` (with that environment's
interpreter) imports the declared modules, then takes one tiny step:

* ``smoke: train_step`` (the policy backends): one monolithic train step of the
  ``qwen3_moe_tiny_smoke`` model (2 layers) on 1 gloo rank through the backend's
  own engine (``harness.registry.policy.create_engine``), on a synthetic batch of 2 sequences of 32 tokens;
  the loss and grad norm must be finite;
* ``smoke: modules`` (vllm): imports the harness's vLLM backend modules (engine,
  worker extension, profiling worker) and ``vllm.platforms``; it does not start a
  vLLM engine (tens of seconds on CPU; ``ci/l3_vllm.sh`` runs those).

Prints one JSON line ``{"ok", "backend", "python", "step", "seconds", "error"}``;
exit 0 when ok, 1 otherwise.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import time
import traceback

SMOKE_WORKLOAD = "qwen3_moe_tiny_smoke"


def _policy_step(backend: str, extra: tuple[str, ...]) -> dict:
    import torch.distributed as dist

    from harness.parallel.rendezvous import RendezvousServer
    from harness.policy.distributed import init_distributed
    from harness.policy.synthetic import synthetic_batch
    from harness.registry.policy import create_engine
    from harness.spec import load_spec

    overrides = [f"policy.backend={backend}", "model.layers=2", "policy.seq_len=32", "policy.micro_batch_size=2",
                 *extra]
    spec = load_spec(SMOKE_WORKLOAD, overrides)
    held = RendezvousServer()
    try:
        init_distributed(0, 1, held.host, held.port)
        engine = create_engine(spec, 0)
        metrics = engine.train(synthetic_batch(spec, 2, seed=0))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        held.close()
    step = {"loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"])}
    if not all(math.isfinite(v) for v in step.values()):
        raise RuntimeError(f"one train step gave non-finite metrics {step}")
    return step


def _modules_step(modules: tuple[str, ...]) -> dict:
    for name in modules:
        importlib.import_module(name)
    return {"modules": len(modules)}


def smoke(backend: str) -> dict:
    from harness.workerenv.declare import declaration

    t0 = time.perf_counter()
    out: dict = {"ok": False, "backend": backend, "python": sys.executable, "step": None, "error": None}
    try:
        decl = declaration(backend)
        for name in decl.imports:
            importlib.import_module(name)
        out["step"] = (_policy_step(backend, decl.smoke_overrides) if decl.smoke == "train_step"
                       else _modules_step(decl.smoke_modules))
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the smoke check reports any failure
        last = traceback.format_exc().strip().splitlines()[-1]
        out["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else last
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m harness.workerenv.smoke BACKEND", file=sys.stderr)
        return 2
    result = smoke(args[0])
    print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
