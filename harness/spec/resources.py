"""What a run of a workload holds in memory, estimated from the spec alone.

A lower bound, never an exact figure: it counts what every run must hold and
leaves out what depends on the implementation (allocator slack, Python objects,
the profilers' buffers), so a refusal made from it is never wrong about a run
that would have fitted.

* **policy, per rank**: the rank's share of the parameters (embedding and head
  split over tp; a pipeline stage's layers; attention split over tp; experts
  over ep) times 16 bytes: fp32 weights, gradients and AdamW's two moments
  (a bfloat16 model keeps fp32 master weights: the same 16);
* **activations, per rank**: one micro-batch of ``policy.seq_len`` tokens,
  ``hidden`` floats per token per layer of the stage, split over tp and cp
  (autograd keeps at least one such tensor per layer);
* **KV cache, per engine**: every sample of a step held at once
  (``prompts_per_step * generations_per_prompt``, of up to ``policy.seq_len``
  tokens), ``2 * kv_heads * head_dim`` floats per token per layer, split over
  the engine's tp.

Pure but for one bounded read of ``/proc/meminfo`` (:func:`machine_memory_bytes`).
``harness.spec.runplan.build_plan`` refuses a local CPU run whose total exceeds this
machine's memory before anything starts (:func:`memory_refusal`); ``golden plan``
prints the estimate and refuses the same. A cuda run (per-device memory) and a run
joining a cluster are not checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.spec.errors import SpecError

__all__ = ["Resources", "estimate", "local_refusal", "machine_memory_bytes", "memory_refusal"]

BYTES_PER_PARAM = 16  # fp32 weights + gradients + AdamW exp_avg + exp_avg_sq
FLOAT_BYTES = 4  # activations and KV cache counted in fp32 (the CPU goldens' dtype; bf16 halves it)


@dataclass(frozen=True)
class Resources:
    parameters: int  # the whole model's
    policy_rank_bytes: int  # parameters + optimizer state of the largest rank
    activation_rank_bytes: int  # one micro-batch's per-layer activations on the largest rank
    kv_engine_bytes: int  # one engine's KV cache for a whole step
    policy_ranks: int
    engines: int

    @property
    def total_bytes(self) -> int:
        """Everything the run's processes hold at once (a colocated engine shares the host)."""
        return (self.policy_ranks * (self.policy_rank_bytes + self.activation_rank_bytes)
                + self.engines * self.kv_engine_bytes)

    def largest(self) -> str:
        """The spec field that most decides the total (for a refusal's message)."""
        parts = {"model.layers": self.policy_ranks * self.policy_rank_bytes,
                 "policy.seq_len": self.policy_ranks * self.activation_rank_bytes,
                 "grpo.prompts_per_step": self.engines * self.kv_engine_bytes}
        return max(parts, key=lambda k: parts[k])

    def summary(self) -> str:
        gib = 1 << 30
        return (f"{self.parameters:.3g} parameters; per policy rank {self.policy_rank_bytes / gib:.3g} GiB of "
                f"weights and optimizer state + {self.activation_rank_bytes / gib:.3g} GiB of activations; "
                f"KV cache {self.kv_engine_bytes / gib:.3g} GiB per engine; "
                f"{self.total_bytes / gib:.3g} GiB in all ({self.policy_ranks} policy ranks, {self.engines} engines)")


def _layer_parameters(m: dict[str, Any]) -> tuple[int, int]:
    """(attention + norms + router, experts) parameters of one layer."""
    attn = m["hidden"] * m["head_dim"] * (2 * m["heads"] + 2 * m["kv_heads"]) + 4 * m["hidden"]
    router = m["hidden"] * m["experts"]
    experts = 3 * m["hidden"] * m["moe_intermediate"] * m["experts"]
    return attn + router, experts


def estimate(spec: dict[str, Any]) -> Resources:
    """The estimate of a loaded spec (defaults filled)."""
    m, p, r, g = spec["model"], spec["policy"], spec["rollout"], spec["grpo"]
    dense, experts = _layer_parameters(m)
    embed = 2 * m["vocab"] * m["hidden"]
    parameters = m["layers"] * (dense + experts) + embed + m["hidden"]
    stage_layers = -(-m["layers"] // p["pp"])  # the largest stage
    rank_params = (stage_layers * (dense // p["tp"] + experts // (p["ep"] * p["etp"]))
                   + embed // p["tp"])  # conservative: the first/last stage holds embedding or head, counted whole
    tokens = p["micro_batch_size"] * p["seq_len"] // (p["tp"] * p["cp"])
    activations = tokens * m["hidden"] * stage_layers * FLOAT_BYTES
    samples = g["prompts_per_step"] * g["generations_per_prompt"]
    kv = samples * p["seq_len"] * m["layers"] * 2 * m["kv_heads"] * m["head_dim"] * FLOAT_BYTES // r["tp"]
    world = p["tp"] * p["pp"] * p["cp"] * p["dp"]
    return Resources(parameters, rank_params * BYTES_PER_PARAM, activations, kv, world, r["engines"])


MEMINFO = "/proc/meminfo"
MAX_MEMINFO_BYTES = 1 << 16


def machine_memory_bytes(path: str = MEMINFO) -> int | None:
    """``MemTotal`` of this machine (Linux), None when it cannot be read (then nothing is refused).
    The one read of this module, bounded."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_MEMINFO_BYTES).decode("ascii", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "MemTotal" and value.split() and value.split()[0].isdigit():
            return int(value.split()[0]) * 1024
    return None


def local_refusal(spec: dict[str, Any], ray_address: str | None, need: Resources | None = None) -> SpecError | None:
    """:func:`memory_refusal` against this machine for a run that holds every rank and engine
    here: a CPU run that joins no cluster (``ray_address`` None); None for any other run."""
    if spec["platform"]["device"] != "cpu" or ray_address:
        return None
    return memory_refusal(spec, machine_memory_bytes(), need)


def memory_refusal(spec: dict[str, Any], memory_bytes: int | None, need: Resources | None = None) -> SpecError | None:
    """A ``SpecError`` (exit 2) naming the field that most decides it when a run of ``spec`` on one
    machine of ``memory_bytes`` cannot hold the estimate (module doc; ``need``: the estimate when
    the caller made it already); None when it can, or when the memory is unknown."""
    if memory_bytes is None:
        return None
    need = need if need is not None else estimate(spec)
    if need.total_bytes <= memory_bytes:
        return None
    return SpecError(need.largest(), f"the run needs at least {need.total_bytes / (1 << 30):.3g} GiB and this "
                                     f"machine has {memory_bytes / (1 << 30):.3g} GiB ({need.summary()}; "
                                     "an estimate that leaves out everything but weights, optimizer state, "
                                     "one micro-batch's activations and the KV cache)")
