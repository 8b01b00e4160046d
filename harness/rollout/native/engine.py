"""``Engine``: the native rollout backend's generation engine, composed of its parts.

An ``Engine`` is the inference twin of the reference Qwen3-MoE (as vLLM is to
Megatron): a separate implementation over HF-named tensors that computes with
``harness.ops``, the pieces the reference model is built from, so both stacks
compute the same math. Its results are batch-invariant: a request's tokens and
logprobs never depend on what else is in the batch, on ``max_batch_size`` or on
its KV slot (``forward`` says how).

The parts, one job each (all in ``harness.rollout.native``):

* ``weights.PackedWeights``: this TP rank's shards, packed per layer, HF-named views, refit;
* ``forward.Forward``: one step's math, per request and batched decode, and the TP sum;
* ``probe``: whether this machine's kernels may run the batched decode;
* ``scheduler.Scheduler``: admission, steps, prefill dedup and sampling (``sampling``);
* ``kv_cache.KVCachePool``: one KV slot per running request.

The TP layout of the HF-named tensors (``harness.rollout.sharding``) is shared
with ``RolloutWorker`` (unsharding) and the vLLM backend (weight loading).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from harness import ops
from harness.model.config import ModelConfig
from harness.rollout.native.decode_graphs import GRAPHS_ENV, DecodeGraphs, graphs_unavailable
from harness.rollout.native.forward import Forward
from harness.rollout.native.kv_cache import KVCachePool
from harness.rollout.native.probe import choose_batched_decode, choose_batched_sampling, choose_invariant
from harness.rollout.native.scheduler import Scheduler
from harness.rollout.native.weights import PackedWeights
from harness.rollout.sharding import ShardPlan

DECODE_KERNELS = ("standard", "invariant")
DECODE_KERNELS_ENV = "HARNESS_NATIVE_DECODE_KERNELS"


def as_model_config(model_cfg: ModelConfig | Mapping[str, Any]) -> ModelConfig:
    """Accept a ``ModelConfig``, a spec ``model`` block or a whole spec dict."""
    if isinstance(model_cfg, ModelConfig):
        return model_cfg
    return ModelConfig.from_spec(model_cfg)


def default_decode_kernels(device: torch.device) -> str:
    """The decode kernels an engine on ``device`` uses unless told otherwise: ``"invariant"`` on
    cuda (batched decode on the fixed-order kernels, fp32 and bf16, probe-checked at start; a
    failing probe stops the engine with the reason), ``"standard"`` elsewhere (the CPU's
    batched decode is bit-identical to the per-request one by construction)."""
    return "invariant" if device.type == "cuda" else "standard"


def default_cuda_graphs(device: torch.device, tp_size: int) -> bool:
    """Whether an engine replays its decode steps as CUDA graphs unless told otherwise: on
    cuda at TP 1 (graphs need the invariant kernels, the cuda default, and cannot capture a
    TP step's collectives), never elsewhere. The cuda goldens were refreshed with graphs
    on (issue 20); the CPU has none."""
    return device.type == "cuda" and tp_size == 1


class Engine:
    """Generation over HF-named weights with optional tensor parallelism.

    ``weights`` are *full* tensors (the engine keeps its TP shard); ``None``
    allocates zeros, to be filled by ``load_weights`` (a refit). With
    ``tp_size > 1`` every TP rank constructs an engine with its ``tp_rank``
    and the same ``tp_group`` and calls every method collectively.

    ``batched_decode``: ``None`` (default) decodes the running requests
    together when the start-up probe confirms this machine's kernels give the
    per-request bits (``probe``); ``False`` forces the per-request decode;
    ``True`` requires the batched one (ValueError if the dtype or device is not
    supported or the probe fails). Either way the tokens and logprobs are the same.
    On a GPU the probe also decodes real rows both ways (``probe.probe_decode``).

    ``decode_kernels``: ``None`` reads ``$HARNESS_NATIVE_DECODE_KERNELS``; unset or empty, the
    device's default (``default_decode_kernels``: ``"invariant"`` on cuda, ``"standard"`` on the
    CPU, so no CPU golden moved). ``"standard"`` decodes with the per-request
    computation's kernels, as above; ``"invariant"`` decodes every decoding row, a
    lone one too, through the batched path on the fixed-order kernels of
    ``invariant`` (a row's bits are the same in a batch of one and in any batch,
    checked at start by ``probe.probe_invariant``; where it fails: a ValueError naming the
    reason when the kernels were asked for (argument or environment), a warning with the
    reason and the standard kernels when they were only the device default; and
    ``batched_decode=False`` contradicts an explicit ``"invariant"`` but turns the default
    back to ``"standard"``), and samples the decode rows
    on the host (``sample_rows`` on CPU kernels, built batch-invariant there). These
    kernels round differently from the per-request ones: a run's tokens and
    logprobs are a function of its requests for each setting, not across settings.

    ``cuda_graphs``: ``None`` reads ``$HARNESS_NATIVE_CUDA_GRAPHS`` (``1`` on, ``0`` off); unset
    or empty, the device's default (``default_cuda_graphs``: on for cuda at TP 1, off
    elsewhere). On: decode-only steps are replayed as CUDA graphs
    (``decode_graphs.DecodeGraphs``: same bits as the eager step, checked per bucket; one
    extra KV slot for padding rows); needs cuda, the invariant kernels and ``tp_size`` 1:
    asked for (argument or environment) without them, a ValueError naming what is missing;
    only the default, a warning with the reason and eager decode. A replayed step
    dispatches no ATen operators.
    """

    def __init__(
        self,
        model_cfg: ModelConfig | Mapping[str, Any],
        weights: Mapping[str, torch.Tensor] | None,
        *,
        tp_rank: int = 0,
        tp_size: int = 1,
        tp_group: Any = None,
        max_batch_size: int = 8,
        device: str | torch.device = "cpu",
        eos_token_id: int | None = None,
        batched_decode: bool | None = None,
        decode_kernels: str | None = None,
        cuda_graphs: bool | None = None,
    ) -> None:
        self.cfg = as_model_config(model_cfg)
        if max_batch_size < 1:
            raise ValueError(f"rollout.max_batch_size must be >= 1, got {max_batch_size}")
        if tp_size > 1 and tp_group is None:
            raise ValueError("an engine with tp_size > 1 needs its tp_group")
        self.plan = ShardPlan(self.cfg, tp_rank, tp_size)
        self.tp_group = tp_group
        self.device = torch.device(device)
        self.dtype = self.cfg.torch_dtype()
        self.max_batch_size = max_batch_size
        self.eos_token_id = eos_token_id
        self.weight_version = 0
        self.packed = PackedWeights(self.cfg, self.plan, self.dtype, self.device)
        graphs_env = os.environ.get(GRAPHS_ENV, "")
        if graphs_env not in ("", "0", "1"):
            raise ValueError(f"${GRAPHS_ENV} must be 0 or 1, got {graphs_env!r}")
        graphs_asked = cuda_graphs is not None or graphs_env != ""
        if cuda_graphs is None:  # unset: the device's default (default_cuda_graphs)
            cuda_graphs = graphs_env == "1" if graphs_env else default_cuda_graphs(self.device, tp_size)
        self.kv = KVCachePool(
            layers=self.cfg.layers,
            slots=max_batch_size + (1 if cuda_graphs else 0),  # + the graphs' scratch slot
            max_position=self.cfg.max_position,
            kv_heads=self.plan.local_kv_heads,
            head_dim=self.cfg.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        self.forward = Forward(self.cfg, self.plan, self.packed, self.kv, tp_group, self.device, self.dtype)
        if weights is not None:
            missing = [n for n in self.packed.full_shapes if n not in weights]
            if missing:
                raise ValueError(f"engine weights are missing {len(missing)} tensor(s), first: {missing[:3]}")
            self.load_weights(weights.items())
        explicit = decode_kernels is not None or bool(os.environ.get(DECODE_KERNELS_ENV))
        if decode_kernels is None:
            decode_kernels = os.environ.get(DECODE_KERNELS_ENV) or default_decode_kernels(self.device)
        if decode_kernels not in DECODE_KERNELS:
            raise ValueError(f"decode_kernels (or ${DECODE_KERNELS_ENV}) must be one of {DECODE_KERNELS}, "
                             f"got {decode_kernels!r}")
        if decode_kernels == "invariant" and batched_decode is False:
            if explicit:
                raise ValueError("decode_kernels='invariant' decodes batched; batched_decode=False contradicts it")
            decode_kernels = "standard"  # the device default yields to an explicit per-request decode
        # a requested kernel set that fails its probe is a ValueError; the device default falls
        # back to the standard kernels with a warning naming the reason (choose_invariant)
        if decode_kernels == "invariant" and choose_invariant(self.forward, max_batch_size, requested=explicit):
            batched, sampling = True, True
        else:
            batched = choose_batched_decode(self.forward, max_batch_size, batched_decode)
            sampling = batched and choose_batched_sampling(self.device, self.cfg.vocab)
        graphs = None
        problem = graphs_unavailable(self.forward) if cuda_graphs and not graphs_asked else None
        if problem is not None:
            # the device default yields where it cannot hold: with a warning naming the reason
            # where the invariant kernels were tried and their probe failed, silently where the
            # standard kernels were chosen (by name or by batched_decode=False)
            if decode_kernels == "invariant":
                warnings.warn(f"native engine: decode without CUDA graphs: {problem}", stacklevel=2)
            cuda_graphs = False
        if cuda_graphs:  # asked for: unavailable is an error (graphs change no bit, only launches)
            graphs = DecodeGraphs(self.forward, max_batch_size, self.kv.reserve(max_batch_size))
        self.scheduler = Scheduler(
            self.cfg, self.forward, self.kv, max_batch_size=max_batch_size, eos_token_id=eos_token_id,
            batched_decode=batched, batched_sampling=sampling, graphs=graphs,
        )

    @property
    def decode_kernels(self) -> str:
        """``"invariant"`` or ``"standard"``: the kernels of the decode path in use."""
        return self.forward.kernels

    @property
    def batched_decode(self) -> bool:
        """The decode path in use: True when decoding rows share one batched forward."""
        return self.scheduler.batched_decode

    # -- weights ---------------------------------------------------------------

    def state_dict_info(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Full (unsharded) ``(shape, dtype)`` per HF name: what a refit must send."""
        return self.packed.state_dict_info()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """Copy full tensors into this rank's shards (exactly); return the names loaded.
        Unknown names, wrong shapes or dtypes raise ValueError naming the tensor."""
        return self.packed.load(named_tensors)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's shards under HF names (``ShardPlan.unshard`` rebuilds full tensors)."""
        return self.packed.state_dict()

    # -- generation ---------------------------------------------------------------

    @torch.no_grad()
    def prompt_logprobs(self, token_ids: Sequence[int]) -> torch.Tensor:
        """``[S]`` fp32 logprobs of ``token_ids`` under the engine (column 0 is 0).

        Uses (and frees) one KV slot; the design.md per-token convention.
        """
        slot = self.kv.allocate()
        try:
            _, (logits,) = self.forward.step([(slot, 0, list(token_ids))])
        finally:
            self.kv.release(slot)
        ids = torch.tensor(list(token_ids), device=self.device).unsqueeze(0)
        return ops.token_logprobs(logits.unsqueeze(0), ids)[0]

    def generate(self, requests: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Generate for every request; results in request order (``scheduler``), each
        stamped with the current ``weight_version``."""
        return self.scheduler.generate(requests, self.weight_version)
