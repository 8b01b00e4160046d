"""The numerics canary: a small battery of CPU kernels hashed bit for bit.

Run once per gate run, in a fresh interpreter started exactly as a worker is
(the pinned environment, ``harness.portable.kernels.activate``), it hashes what
the golden workloads' numerics rest on: the sgemm shapes of the tiny models,
the transcendental and reduction kernels (exp, log, tanh, sigmoid, silu,
softmax, log-softmax, rsqrt, sqrt, sums, norms, cumsum, top-k), the seeded
samplers, one backward through RMSNorm, attention-shaped bmm and a SwiGLU, an
AdamW step, and the reference Qwen3-MoE's logits, gradients and optimizer step.
Its digests are stored beside the goldens (``harness.portable.drift``): a
machine whose pinned kernels give other bits is refused as environment drift
(no verdict) naming the ops that moved, in seconds, instead of failing every
rollout and training row of every golden.

``python -m harness.portable.canary`` prints the battery as JSON (the command
behind the machine-kind table of docs/gate.md). Every input comes from a
seeded generator; one thread; deterministic algorithms.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable

import torch

__all__ = ["battery", "digest", "main", "process_state"]


def digest(*tensors: torch.Tensor) -> str:
    """sha256 (16 hex) of the tensors' bytes in order (shape and dtype included)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous()
        h.update(f"{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ops() -> dict[str, Callable[[], tuple[torch.Tensor, ...]]]:
    g = _gen(0)
    tokens = torch.randn(128, 64, generator=g)  # 2 x 64 tokens of the tiny models' hidden size
    w_vocab, w_qkv = torch.randn(256, 64, generator=g), torch.randn(192, 64, generator=g)
    w_up, w_down = torch.randn(64, 64, generator=g), torch.randn(64, 32, generator=g)
    q, k = torch.randn(16, 64, 16, generator=g), torch.randn(16, 64, 16, generator=g)
    x = torch.randn(64, 256, generator=g)
    v = torch.rand(4099, generator=g) * 1e-5
    f = torch.nn.functional
    return {
        "sgemm_128x64x256": lambda: (tokens @ w_vocab.t(),),
        "sgemm_128x64x192": lambda: (f.linear(tokens, w_qkv),),
        "sgemm_128x32x64": lambda: (f.linear(tokens[:, :32], w_down),),
        "addmm_bias": lambda: (torch.addmm(x[:, :64], tokens[:64], w_up),),
        "bmm_attention": lambda: (torch.bmm(q, k.transpose(1, 2)),),
        "exp": lambda: (x.exp(),),
        "log": lambda: (x.abs().add(1e-6).log(),),
        "tanh": lambda: (x.tanh(),),
        "sigmoid": lambda: (x.sigmoid(),),
        "silu": lambda: (f.silu(x),),
        "softmax": lambda: (torch.softmax(x, -1),),
        "log_softmax": lambda: (torch.log_softmax(x, -1),),
        "rsqrt": lambda: (v.rsqrt(),),
        "sqrt": lambda: (v.sqrt(), v.clone().sqrt_()),
        "sum_mean": lambda: (x.sum(-1), x.pow(2).mean(-1), x.sum()),
        "cumsum": lambda: (x.cumsum(-1),),
        "vector_norm": lambda: (torch.linalg.vector_norm(x), torch.linalg.vector_norm(x, dim=-1)),
        "topk_argmax": lambda: (torch.topk(x, 8, -1).values, x.argmax(-1)),
        "cos_sin": lambda: (torch.cos(x), torch.sin(x)),
        "sampler": lambda: (torch.multinomial(torch.softmax(x, -1), 1, generator=_gen(1)),
                            torch.rand(64, 256, generator=_gen(2))),
        "backward_block": lambda: _backward_block(tokens, w_qkv, w_up),
        "adamw_step": _adamw_step,
        "reference_model": _reference_model,
    }


def _backward_block(tokens: torch.Tensor, w_qkv: torch.Tensor, w_up: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """RMSNorm -> q/k projection -> attention scores -> softmax -> SwiGLU -> loss, and its gradients."""
    x = tokens.clone().requires_grad_(True)
    wq, wu = w_qkv[:64].clone().requires_grad_(True), w_up.clone().requires_grad_(True)
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    qk = (h @ wq.t()).view(2, 64, 64)
    p = torch.softmax(qk @ qk.transpose(1, 2) / 8.0, -1)
    y = (p @ qk).reshape(128, 64)
    z = torch.nn.functional.silu(y @ wu.t()) * (y @ wu)
    loss = torch.log_softmax(z, -1)[:, 0].mean()
    loss.backward()
    return loss, x.grad, wq.grad, wu.grad


def _adamw_step() -> tuple[torch.Tensor, ...]:
    w = torch.nn.Parameter(torch.randn(4099, generator=_gen(3)))
    opt = torch.optim.AdamW([w], lr=1e-3, foreach=False)
    grads = torch.randn(3, 4099, generator=_gen(4)) * 1e-2
    for step in range(3):
        w.grad = grads[step].clone()
        opt.step()
    return (w.detach(),)


def _reference_model() -> tuple[torch.Tensor, ...]:
    from harness.model.config import ModelConfig
    from harness.model.qwen3_moe import build_reference_model

    cfg = ModelConfig(layers=2, hidden=64, heads=8, kv_heads=2, head_dim=16, experts=8, top_k=2,
                      moe_intermediate=32, vocab=256, max_position=512, dtype="float32")
    model = build_reference_model(cfg, seed=1234).train()
    ids = torch.randint(0, 256, (2, 64), generator=_gen(5))
    out = model(ids)
    logits = out[0] if isinstance(out, tuple) else out
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 256), ids[:, 1:].reshape(-1))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False).step()
    return (logits, *grads, *(p.detach() for p in model.parameters()))


def battery() -> dict[str, str]:
    """``{op: digest}`` of every op of the battery, in a fixed order."""
    return {name: digest(*fn()) for name, fn in _ops().items()}


def process_state() -> dict[str, object]:
    """What decides this process's CPU code paths: ATen's capability, the pins' variables, and
    whether the portable kernels are installed."""
    from harness.portable import kernels, pins

    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "pins": {name: os.environ.get(name) for name in pins.PINS},
        "portable_kernels": kernels.installed(),
    }


def main(argv: list[str] | None = None) -> int:
    """Print ``{"state": ..., "ops": {...}}`` as one JSON line (after activating the pinned
    process state when the pins are in force)."""
    from harness import code_identity
    from harness.portable import kernels, pins

    code_identity.check_process("the numerics canary")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if pins.in_force() and os.environ.get("GOLDEN_CANARY_NO_KERNELS") != "1":  # the bench's pins-only arm
        kernels.activate()
    print(json.dumps({"state": process_state(), "ops": battery()}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
