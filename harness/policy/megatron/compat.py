"""CPU compatibility layer for megatron-core (gloo, CPU-only torch).

megatron-core assumes CUDA in a handful of places. This module patches them
so the local (non-Transformer-Engine) GPTModel trains on CPU over gloo. It is
applied only by the megatron policy backend, only when
`platform.device == "cpu"`, and only for the versions in SUPPORTED; it is
idempotent and process-wide (every policy rank is its own process).

Patch points (docs/megatron.md refers to them by these numbers):

1. `torch.cuda.current_device` -> CPU device, `torch.cuda.synchronize` -> no-op
   (RoPE `get_emb`, the global memory buffer).
2. CUDA RNG -> CPU RNG: `torch.cuda.{get,set}_rng_state`, `torch.cuda.manual_seed`
   and `tensor_parallel.random._{get,set}_cuda_rng_state`
   (`model_parallel_cuda_manual_seed`, `CudaRNGStatesTracker`).
3. A TorchFunctionMode entered for the rest of the process: `Tensor.cuda()` is
   the identity, `device=` keywords naming cuda become "cpu", `Tensor.to(cuda)`
   becomes `Tensor.to("cpu")` (about 15 hard-coded CUDA sites).
4. `moe_utils.te_general_gemm = None` when missing (0.16.1 NameError without TE).
5. Inert `torch.cuda.Stream` / `Event` / `current_stream` / `stream(...)`
   (`MoEAlltoAllTokenDispatcher.__init__`).
6. `maybe_move_tensor_to_cpu(t, as_numpy=True)` returns a numpy array, in
   `moe_utils` and in `token_dispatcher`'s own reference (gloo all_to_all
   needs python split sizes).
7. `WrappedTorchNorm` built with sequence_parallel temporarily cleared; its
   parameters are then tagged `.sequence_parallel = True` (torch norms + SP).
8. Uneven list `all_gather` / `reduce_scatter` on gloo: pad to the largest
   first dimension, run the collective, copy back the valid rows (MoE
   dispatch with ETP > 1).

megatron's pipeline schedule (`get_forward_backward_func`, 1F1B) needs no
patch point of its own: its CUDA device / stream uses are covered by 1, 3 and
5, and the engine configures `batch_p2p_comm=False` (plain isend/irecv on
gloo, see model.transformer_config).

For megatron-core >= 0.19 on CPU a stub for
`megatron.core.transformer.moe.ops.paged_stash` is registered before the
import (its unconditional `import triton`); see `install_import_stubs`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from typing import Any

# Versions the layer was written and tested against (major.minor).
SUPPORTED = ("0.16", "0.19")

_APPLIED = False
_MODE: Any = None


class CompatError(RuntimeError):
    pass


def megatron_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-core")
    except PackageNotFoundError as exc:  # pragma: no cover - import guard
        raise CompatError(
            "policy.backend: megatron needs megatron-core; install it with "
            "`pip install 'megatron-core==0.16.1'` (Python 3.11) or the `megatron` extra"
        ) from exc


def check_version(v: str | None = None) -> str:
    v = v or megatron_version()
    if ".".join(v.split(".")[:2]) not in SUPPORTED:
        raise CompatError(
            f"megatron-core {v} is not supported by the CPU compatibility layer "
            f"(supported: {', '.join(s + '.x' for s in SUPPORTED)})"
        )
    return v


def install_import_stubs() -> None:
    """Before `import megatron.core` (>= 0.19 only): a stub for the triton-only
    paged_stash module, so the package imports without triton."""
    name = "megatron.core.transformer.moe.ops.paged_stash"
    if name in sys.modules:
        return
    try:
        import triton  # noqa: F401

        return
    except ImportError:
        pass
    v = megatron_version()
    if tuple(int(x) for x in v.split(".")[:2]) < (0, 19):
        return
    stub = types.ModuleType(name)
    stub.GLOBAL_BLOCK_SIZE = 1024  # type: ignore[attr-defined]
    stub.paged_stash_copy_kernel = None  # type: ignore[attr-defined]
    stub.paged_stash_pop_kernel = None  # type: ignore[attr-defined]
    sys.modules[name] = stub


# -- inert CUDA stream / event (patch 5) ------------------------------------------


class _Event:
    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def record(self, *a: Any, **k: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def wait(self, *a: Any, **k: Any) -> None:
        return None

    def query(self) -> bool:
        return True


class _Stream:
    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def wait_stream(self, *a: Any, **k: Any) -> None:
        return None

    def wait_event(self, *a: Any, **k: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def record_event(self, event: Any = None) -> _Event:
        return event if event is not None else _Event()


_SHARED_STREAM = _Stream()


# -- device rewrite (patch 3) ------------------------------------------------------


def _mentions_cuda(device: Any) -> bool:
    import torch

    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return "cuda" in device
    return False


def _device_mode_class():
    import torch
    from torch.overrides import TorchFunctionMode

    to_fn = torch.Tensor.to
    cuda_fn = torch.Tensor.cuda

    class CpuDeviceMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is cuda_fn:
                return args[0]
            if "device" in kwargs and (_mentions_cuda(kwargs["device"]) or isinstance(kwargs["device"], int)):
                kwargs["device"] = "cpu"
            if func is to_fn and len(args) > 1 and (_mentions_cuda(args[1]) or isinstance(args[1], int)):
                args = (args[0], "cpu", *args[2:])
            return func(*args, **kwargs)

    return CpuDeviceMode


# -- uneven gloo collectives (patch 8) ----------------------------------------------


def _padded_all_gather(orig):
    import torch

    @functools.wraps(orig)
    def all_gather(tensor_list, tensor, group=None, async_op=False):
        sizes = [t.shape[0] if t.dim() else None for t in tensor_list] + [tensor.shape[0] if tensor.dim() else None]
        if async_op or None in sizes or len(set(sizes)) == 1:
            return orig(tensor_list, tensor, group=group, async_op=async_op)
        # every rank must pad to the same size: agree on the max first dim
        n = max(s for s in sizes)
        def pad(t):
            return torch.cat([t, t.new_zeros((n - t.shape[0], *t.shape[1:]))]) if t.shape[0] < n else t

        bufs = [t.new_zeros((n, *t.shape[1:])) for t in tensor_list]
        orig(bufs, pad(tensor), group=group)
        for out, buf in zip(tensor_list, bufs):
            out.copy_(buf[: out.shape[0]])
        return None

    return all_gather


def _padded_reduce_scatter(orig):
    import torch

    @functools.wraps(orig)
    def reduce_scatter(output, input_list, op=None, group=None, async_op=False):
        import torch.distributed as dist

        op = dist.ReduceOp.SUM if op is None else op
        sizes = [t.shape[0] for t in input_list] + [output.shape[0]]
        if async_op or len(set(sizes)) == 1:
            return orig(output, input_list, op=op, group=group, async_op=async_op)
        n = max(sizes)
        def pad(t):
            return torch.cat([t, t.new_zeros((n - t.shape[0], *t.shape[1:]))]) if t.shape[0] < n else t

        out = output.new_zeros((n, *output.shape[1:]))
        orig(out, [pad(t) for t in input_list], op=op, group=group)
        output.copy_(out[: output.shape[0]])
        return None

    return reduce_scatter


# -- apply ----------------------------------------------------------------------------


def import_megatron() -> None:
    """Import megatron-core (version checked, import stubs first) and the modules the patches
    below replace attributes of, without patching anything: what :func:`apply_cpu_compat` imports
    before it patches, in the same order. The warm runtime's megatron fork server calls it once
    (``harness.runner.zygote.FLAVOURS``); every other megatron module is imported after the
    patches, as in a fresh process."""
    check_version()
    install_import_stubs()
    import megatron.core  # noqa: F401
    from megatron.core.tensor_parallel import random  # noqa: F401
    from megatron.core.transformer import torch_norm  # noqa: F401
    from megatron.core.transformer.moe import moe_utils, token_dispatcher  # noqa: F401


def apply_missing_te_fix() -> None:
    """Patch point 4 on every device: megatron-core 0.16.1 names ``te_general_gemm``
    in the router even when Transformer Engine is absent (NameError on the first
    MoE forward; seen on CPU and on an H200 without TE)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def apply_cpu_compat(device: str) -> bool:
    """Apply the CPU patches when `device == "cpu"`; returns True when they are
    (now or already) in effect. On cuda only :func:`apply_missing_te_fix`."""
    global _APPLIED, _MODE
    if device != "cpu":
        apply_missing_te_fix()
        return False
    if _APPLIED:
        return True
    import_megatron()
    import torch
    import torch.distributed as dist
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer import torch_norm
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    cpu = torch.device("cpu")
    # 1. current device / synchronize
    torch.cuda.current_device = lambda: cpu  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    # 2. CUDA RNG -> CPU RNG
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[assignment]
    torch.cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)  # type: ignore[assignment]
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)  # type: ignore[assignment]
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    # 4. missing te_general_gemm (0.16.1 bug without TE; also on cuda)
    apply_missing_te_fix()
    # 5. inert streams/events
    torch.cuda.Stream = _Stream  # type: ignore[assignment,misc]
    torch.cuda.Event = _Event  # type: ignore[assignment,misc]
    torch.cuda.current_stream = lambda *a, **k: _SHARED_STREAM  # type: ignore[assignment]
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]
    # 6. split sizes as numpy
    orig_move = moe_utils.maybe_move_tensor_to_cpu

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor):
            return tensor.detach().cpu().numpy()
        return orig_move(tensor, as_numpy=as_numpy, record_stream=record_stream)

    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    if hasattr(token_dispatcher, "maybe_move_tensor_to_cpu"):
        token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    # 7. torch norms under sequence parallel
    orig_new = torch_norm.WrappedTorchNorm.__new__

    def norm_new(cls, config, *args, **kwargs):
        sp = bool(getattr(config, "sequence_parallel", False))
        if not sp:
            return orig_new(cls, config, *args, **kwargs)
        config.sequence_parallel = False
        try:
            norm = orig_new(cls, config, *args, **kwargs)
        finally:
            config.sequence_parallel = True
        for p in norm.parameters():
            p.sequence_parallel = True
        return norm

    torch_norm.WrappedTorchNorm.__new__ = staticmethod(norm_new)  # type: ignore[assignment]
    # 8. uneven gloo collectives
    dist.all_gather = _padded_all_gather(dist.all_gather)
    dist.reduce_scatter = _padded_reduce_scatter(dist.reduce_scatter)
    # 3. device rewrite, last, for the rest of the process
    _MODE = _device_mode_class()()
    _MODE.__enter__()
    _APPLIED = True
    return True
