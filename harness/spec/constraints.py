"""Layout constraints of a workload: which parallel sizes a model admits.

Every rule is a ``Rule(field, formula, holds, explain)``; ``violations(spec)``
evaluates all of them and returns one ``TopologyError`` per broken rule, in
rule order; ``check_spec(spec)`` raises the first. ``field`` is the knob a
user most likely has to change (``policy.ep`` for ``experts % ep``), and
``formula`` is the constraint as written in docs/spec.md, so tests can assert
exactly which rule fired.

Sources: Megatron-core ``parallel_state.initialize_model_parallel`` and
``transformer_config`` checks,
NeMo RL's rollout-profiler restrictions (seed PR text), and this harness's
own needs (batch split, device capacity).

Input: a *loaded* spec (defaults filled, schema-valid). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.registry.policy import POLICY_BACKENDS, PolicyBackend, policy_backend
from harness.registry.rollout import VLLM_CPU_HEAD_DIMS, RolloutBackend, rollout_backend
from harness.spec.errors import TopologyError

Spec = dict[str, Any]


# What the backend rules below read is declared by the backend registries
# (harness.registry.policy, harness.registry.rollout); these are views of them.
# Policy fields a backend runs at one value only (docs/dtensor.md):
# the dtensor backend is FSDP2 over dp x tensor parallel over tp, no sequence parallel.
POLICY_BACKEND_FIXED: dict[str, dict[str, Any]] = {n: dict(b.fixed) for n, b in POLICY_BACKENDS.items() if b.fixed}
# Policy backends that train LoRA adapters (policy.lora.enabled).
LORA_BACKENDS = tuple(n for n, b in POLICY_BACKENDS.items() if b.lora)


def _fixed(spec: Spec) -> dict[str, Any]:
    return POLICY_BACKEND_FIXED.get(spec["policy"]["backend"], {})


def _policy_backend(spec: Spec) -> PolicyBackend:
    return policy_backend(spec["policy"]["backend"])


def _rollout_backend(spec: Spec) -> RolloutBackend:
    return rollout_backend(spec["rollout"]["backend"])


def _fixed_rule(field: str) -> Rule:
    return Rule(f"policy.{field}", f"policy.{field} fixed by policy.backend (POLICY_BACKEND_FIXED)",
                lambda s: field not in _fixed(s) or _p(s)[field] == _fixed(s)[field],
                lambda s: (f"policy.backend {_p(s)['backend']} supports {field} = {_fixed(s).get(field)} only, "
                           f"got {_p(s)[field]}; use policy.backend: native or megatron"))


def _lora_enabled(spec: Spec) -> bool:
    return bool((spec["policy"].get("lora") or {}).get("enabled", False))



def policy_world(spec: Spec) -> int:
    """world = tp * pp * cp * dp (Megatron's dense grid)."""
    p = spec["policy"]
    return p["tp"] * p["pp"] * p["cp"] * p["dp"]


def rollout_world(spec: Spec) -> int:
    """engines * tp * pp rollout ranks (numbered densely from 0)."""
    r = spec["rollout"]
    return r["engines"] * r["tp"] * r["pp"]


def devices_needed(spec: Spec) -> int:
    """Policy devices, plus the rollout's when it is not colocated."""
    extra = 0 if spec["rollout"]["colocated"] else rollout_world(spec)
    return policy_world(spec) + extra


def stage_layers(spec: Spec) -> list[int]:
    """Layers per pipeline stage (even split, or the explicit
    ``[first, last]`` with the rest shared evenly by the middle stages).
    Only meaningful when the pp rules hold."""
    layers, pp = spec["model"]["layers"], spec["policy"]["pp"]
    layout = spec["policy"]["pp_layout"]
    if layout is None:
        return [layers // pp] * pp
    first, last = layout
    if pp == 2:
        return [first, last]
    middle = (layers - first - last) // (pp - 2)
    return [first] + [middle] * (pp - 2) + [last]


def _pp_layout_ok(spec: Spec) -> bool:
    layers, pp = spec["model"]["layers"], spec["policy"]["pp"]
    layout = spec["policy"]["pp_layout"]
    if layout is None:
        return True
    first, last = layout
    if pp < 2:
        return False
    rest = layers - first - last
    if pp == 2:
        return rest == 0
    return rest >= pp - 2 and rest % (pp - 2) == 0


def _seq_divisor(spec: Spec) -> int:
    """Load-balanced context-parallel chunks (2*cp when cp > 1), each split over tp: every backend
    splits the sequence over tp (sequence parallel, or dtensor's tensor-parallel plans)."""
    p = spec["policy"]
    chunks = 2 * p["cp"] if p["cp"] > 1 else 1
    return chunks * p["tp"]


def _has_rollout_profiler(spec: Spec) -> bool:
    return spec["plugins"]["rollout_profiler"] is not None


@dataclass(frozen=True)
class Rule:
    field: str
    formula: str
    holds: Callable[[Spec], bool]
    explain: Callable[[Spec], str]


def _m(spec: Spec) -> dict[str, Any]:
    return spec["model"]


def _p(spec: Spec) -> dict[str, Any]:
    return spec["policy"]


def _r(spec: Spec) -> dict[str, Any]:
    return spec["rollout"]


RULES: tuple[Rule, ...] = (
    # --- model ---------------------------------------------------------
    Rule("model.kv_heads", "model.heads % model.kv_heads == 0",
         lambda s: _m(s)["heads"] % _m(s)["kv_heads"] == 0,
         lambda s: f"GQA needs heads ({_m(s)['heads']}) to be a multiple of kv_heads ({_m(s)['kv_heads']})"),
    Rule("model.top_k", "model.top_k <= model.experts",
         lambda s: _m(s)["top_k"] <= _m(s)["experts"],
         lambda s: f"top_k ({_m(s)['top_k']}) exceeds experts ({_m(s)['experts']})"),
    Rule("model.head_dim", "model.head_dim % 2 == 0",
         lambda s: _m(s)["head_dim"] % 2 == 0,
         lambda s: f"RoPE rotates halves, head_dim ({_m(s)['head_dim']}) must be even"),
    # --- policy: the two grids ----------------------------------------
    Rule("policy.ep", "model.experts % policy.ep == 0",
         lambda s: _m(s)["experts"] % _p(s)["ep"] == 0,
         lambda s: f"{_m(s)['experts']} experts cannot be split evenly over ep={_p(s)['ep']}"),
    Rule("policy.etp", "(policy.tp * policy.cp * policy.dp) % policy.etp == 0",
         lambda s: (_p(s)["tp"] * _p(s)["cp"] * _p(s)["dp"]) % _p(s)["etp"] == 0,
         lambda s: (f"etp={_p(s)['etp']} does not divide the "
                    f"tp*cp*dp={_p(s)['tp'] * _p(s)['cp'] * _p(s)['dp']} ranks of a pipeline stage")),
    Rule("policy.ep", "(policy.tp * policy.cp * policy.dp) % (policy.etp * policy.ep) == 0",
         lambda s: (_p(s)["tp"] * _p(s)["cp"] * _p(s)["dp"]) % (_p(s)["etp"] * _p(s)["ep"]) == 0,
         lambda s: (f"the expert grid etp*ep={_p(s)['etp'] * _p(s)['ep']} must divide the "
                    f"tp*cp*dp={_p(s)['tp'] * _p(s)['cp'] * _p(s)['dp']} ranks of a pipeline stage "
                    "(MoE parallel folding)")),
    Rule("policy.tp", "model.heads % policy.tp == 0",
         lambda s: _m(s)["heads"] % _p(s)["tp"] == 0,
         lambda s: f"{_m(s)['heads']} attention heads cannot be split over tp={_p(s)['tp']}"),
    # every policy backend shards whole kv heads over tp (harness.parallel.groups.validate_policy_layout)
    Rule("policy.tp", "model.kv_heads % policy.tp == 0",
         lambda s: _m(s)["kv_heads"] % _p(s)["tp"] == 0,
         lambda s: (f"kv_heads={_m(s)['kv_heads']} is not divisible by tp={_p(s)['tp']} (the policy shards whole "
                    "kv heads over tp: no KV replication)")),
    Rule("policy.tp", "model.hidden % policy.tp == 0",
         lambda s: _m(s)["hidden"] % _p(s)["tp"] == 0,
         lambda s: f"hidden={_m(s)['hidden']} is not divisible by tp={_p(s)['tp']}"),
    Rule("policy.tp", "model.vocab % policy.tp == 0",
         lambda s: _m(s)["vocab"] % _p(s)["tp"] == 0,
         lambda s: f"vocab={_m(s)['vocab']} is not divisible by tp={_p(s)['tp']} (vocab-parallel embedding and head)"),
    Rule("policy.etp", "policy.etp == 1",
         lambda s: _p(s)["etp"] == 1,
         lambda s: f"policy.etp={_p(s)['etp']}: only expert tensor parallel size 1 is implemented"),
    Rule("policy.etp", "model.moe_intermediate % policy.etp == 0",
         lambda s: _m(s)["moe_intermediate"] % _p(s)["etp"] == 0,
         lambda s: f"moe_intermediate={_m(s)['moe_intermediate']} is not divisible by etp={_p(s)['etp']}"),
    Rule("policy.sp", "policy.tp == 1 or policy.sp",  # a backend without SP (POLICY_BACKEND_FIXED) is exempt
         lambda s: _p(s)["tp"] == 1 or _p(s)["sp"] or "sp" in _fixed(s),
         lambda s: f"an MoE model with tp={_p(s)['tp']} > 1 must train with sequence parallel (set policy.sp: true)"),
    Rule("policy.pp", "policy.pp_layout != null or model.layers % policy.pp == 0",
         lambda s: _p(s)["pp_layout"] is not None or _m(s)["layers"] % _p(s)["pp"] == 0,
         lambda s: (f"{_m(s)['layers']} layers cannot be split evenly over pp={_p(s)['pp']}; "
                    "give policy.pp_layout: [first_stage_layers, last_stage_layers]")),
    Rule("policy.pp_layout", "first + (pp-2)*middle + last == model.layers, every stage >= 1 layer, pp >= 2",
         _pp_layout_ok,
         lambda s: (f"pp_layout {_p(s)['pp_layout']} does not split {_m(s)['layers']} layers into pp={_p(s)['pp']} "
                    "stages (first, equal middles, last)")),
    Rule("policy.seq_len",
         "policy.seq_len % ((2*policy.cp if policy.cp > 1 else 1) * policy.tp) == 0",
         lambda s: _p(s)["seq_len"] % _seq_divisor(s) == 0,
         lambda s: (f"seq_len={_p(s)['seq_len']} must be a multiple of {_seq_divisor(s)} "
                    "(2*cp load-balanced chunks when cp > 1, each split over tp)")),
    Rule("rollout.max_new_tokens", "rollout.max_new_tokens < policy.seq_len",
         lambda s: _r(s)["max_new_tokens"] < _p(s)["seq_len"],
         lambda s: (f"a sample that generates max_new_tokens={_r(s)['max_new_tokens']} tokens after its prompt "
                    f"never fits policy.seq_len={_p(s)['seq_len']}: the trainer would refuse it (SequenceTooLong)")),
    Rule("seed", "seed * 1000 + policy_world < 2**63",
         lambda s: s["seed"] * 1000 + policy_world(s) < 2**63,
         lambda s: (f"seed={s['seed']} is too large: each policy rank seeds its generators with seed*1000 + rank, "
                    "which must fit torch's signed 64-bit seed")),
    Rule("policy.seq_len", "policy.seq_len <= model.max_position",
         lambda s: _p(s)["seq_len"] <= _m(s)["max_position"],
         lambda s: f"seq_len={_p(s)['seq_len']} exceeds max_position={_m(s)['max_position']}"),
    Rule("policy.micro_batch_size",
         "(grpo.prompts_per_step * grpo.generations_per_prompt) % (policy.dp * policy.micro_batch_size) == 0",
         lambda s: (s["grpo"]["prompts_per_step"] * s["grpo"]["generations_per_prompt"])
         % (_p(s)["dp"] * _p(s)["micro_batch_size"]) == 0,
         lambda s: (f"{s['grpo']['prompts_per_step'] * s['grpo']['generations_per_prompt']} samples per step cannot be "
                    f"split into dp={_p(s)['dp']} ranks x micro-batches of {_p(s)['micro_batch_size']}")),
    Rule("grpo.generations_per_prompt", "not grpo.leave_one_out or grpo.generations_per_prompt >= 2",
         lambda s: not s["grpo"]["leave_one_out"] or s["grpo"]["generations_per_prompt"] >= 2,
         lambda s: "a leave-one-out baseline needs at least 2 generations per prompt"),
    # megatron runs on cpu through harness.policy.megatron.compat; its context
    # parallelism exists only in TEDotProductAttention (Transformer Engine, a
    # GPU library). On cuda the engine re-checks that TE is importable at start.
    Rule("policy.cp", "policy.backend != megatron or policy.cp == 1 or platform.device == cuda",
         lambda s: not _policy_backend(s).cp_needs_cuda or _p(s)["cp"] == 1 or s["platform"]["device"] == "cuda",
         lambda s: (f"policy.cp={_p(s)['cp']} with policy.backend: megatron needs Transformer Engine "
                    "(megatron-core context parallelism is TEDotProductAttention only), which needs "
                    "platform.device: cuda; set policy.cp: 1 or policy.backend: native")),
    *(_fixed_rule(f) for f in ("pp", "cp", "ep", "etp", "sp")),
    Rule("policy.lora.enabled", "not policy.lora.enabled or policy.backend in LORA_BACKENDS",
         lambda s: not _lora_enabled(s) or _p(s)["backend"] in LORA_BACKENDS,
         lambda s: (f"the {_p(s)['backend']} policy backend has no LoRA "
                    f"(LoRA runs on policy.backend: {', '.join(LORA_BACKENDS)})")),
    # --- rollout -----------------------------------------------------------
    # vllm runs on cuda (official build) and on cpu (the vllm-cpu build: the
    # `vllm` extra, ci/l3_vllm.sh); whether it is installed is checked by the
    # runner before any actor starts (harness.rollout.vllm.require_vllm).
    # sglang runs on cuda only (no SGLang build runs on CPU: docs/sglang.md).
    Rule("rollout.backend", "platform.device in the rollout backend's devices (vllm: cpu, cuda; sglang: cuda)",
         lambda s: _rollout_backend(s).devices is None or s["platform"]["device"] in _rollout_backend(s).devices,
         lambda s: (f"the {_r(s)['backend']} rollout backend runs on platform.device "
                    f"{' or '.join(_rollout_backend(s).devices)}"
                    f"{_rollout_backend(s).devices_note}, "
                    f"got {s['platform']['device']!r}")),
    Rule("rollout.tp", "an actor-only rollout backend (sglang) runs with rollout.tp == 1 and rollout.async false",
         lambda s: not _rollout_backend(s).actor_only or (_r(s)["tp"] == 1 and not _r(s)["async"]),
         lambda s: (f"rollout.backend: {_r(s)['backend']} runs as one engine in the rollout actor: rollout.tp 1 "
                    f"and rollout.async false (got tp {_r(s)['tp']}, async {_r(s)['async']})")),
    # vllm-cpu 0.32's CPU attention (cpu_attn.get_supported_head_sizes).
    Rule("model.head_dim", "rollout.backend != vllm or platform.device != cpu or model.head_dim in VLLM_CPU_HEAD_DIMS",
         lambda s: _rollout_backend(s).cpu_head_dims is None or s["platform"]["device"] != "cpu"
         or _m(s)["head_dim"] in _rollout_backend(s).cpu_head_dims,
         lambda s: (f"head_dim={_m(s)['head_dim']} is not supported by vLLM's CPU attention "
                    f"(rollout.backend: vllm on platform.device: cpu needs one of {list(VLLM_CPU_HEAD_DIMS)})")),
    Rule("rollout.worker_cls", "rollout.worker_cls == null",
         lambda s: _r(s)["worker_cls"] is None,
         lambda s: f"custom engine worker classes are not supported (got {_r(s)['worker_cls']!r})"),
    Rule("rollout.pp", "plugins.rollout_profiler == null or rollout.pp == 1",
         lambda s: not _has_rollout_profiler(s) or _r(s)["pp"] == 1,
         lambda s: f"rollout profiling supports pipeline_parallel_size 1 only (rollout.pp={_r(s)['pp']})"),
    Rule("rollout.ep", "plugins.rollout_profiler == null or rollout.ep == 1",
         lambda s: not _has_rollout_profiler(s) or _r(s)["ep"] == 1,
         lambda s: f"rollout profiling supports expert_parallel_size 1 only (rollout.ep={_r(s)['ep']})"),
    Rule("rollout.ep", "model.experts % rollout.ep == 0",
         lambda s: _m(s)["experts"] % _r(s)["ep"] == 0,
         lambda s: f"{_m(s)['experts']} experts cannot be split over rollout ep={_r(s)['ep']}"),
    Rule("rollout.tp", "model.heads % rollout.tp == 0",
         lambda s: _m(s)["heads"] % _r(s)["tp"] == 0,
         lambda s: f"{_m(s)['heads']} attention heads cannot be split over rollout tp={_r(s)['tp']}"),
    Rule("rollout.tp", "model.kv_heads % rollout.tp == 0 or rollout.tp % model.kv_heads == 0",
         lambda s: _m(s)["kv_heads"] % _r(s)["tp"] == 0 or _r(s)["tp"] % _m(s)["kv_heads"] == 0,
         lambda s: (f"kv_heads={_m(s)['kv_heads']} can be neither split over nor replicated across "
                    f"rollout tp={_r(s)['tp']}")),
    Rule("rollout.tp", "model.vocab % rollout.tp == 0 and model.hidden % rollout.tp == 0",
         lambda s: _m(s)["vocab"] % _r(s)["tp"] == 0 and _m(s)["hidden"] % _r(s)["tp"] == 0,
         lambda s: (f"vocab={_m(s)['vocab']} and hidden={_m(s)['hidden']} must be divisible by "
                    f"rollout tp={_r(s)['tp']}")),
    Rule("rollout.tp", "model.moe_intermediate % rollout.tp == 0",
         lambda s: _m(s)["moe_intermediate"] % _r(s)["tp"] == 0,
         lambda s: (f"moe_intermediate={_m(s)['moe_intermediate']} (one expert's width) cannot be split over "
                    f"rollout tp={_r(s)['tp']}: each rollout TP rank holds a slice of every expert")),
    # --- placement ---------------------------------------------------------
    Rule("rollout.engines", "not rollout.colocated or rollout_world <= policy_world",
         lambda s: not _r(s)["colocated"] or rollout_world(s) <= policy_world(s),
         lambda s: (f"colocated rollout needs {rollout_world(s)} devices but the policy occupies only "
                    f"{policy_world(s)}; reduce rollout.engines/tp or set rollout.colocated: false")),
    Rule("platform.nodes", "devices_needed <= platform.nodes * platform.gpus_per_node",
         lambda s: devices_needed(s) <= s["platform"]["nodes"] * s["platform"]["gpus_per_node"],
         lambda s: (f"the layout needs {devices_needed(s)} devices but the platform has "
                    f"{s['platform']['nodes']} x {s['platform']['gpus_per_node']} = "
                    f"{s['platform']['nodes'] * s['platform']['gpus_per_node']}")),
)


def violations(spec: Spec) -> list[TopologyError]:
    """One error per broken rule, in rule order (empty when the layout is valid)."""
    from harness.spec import distill  # the distill block's rules (they reuse RULES on the teacher's spec)

    return _layout_violations(spec) + distill.violations(spec, _layout_violations)


def _layout_violations(spec: Spec) -> list[TopologyError]:
    return [TopologyError(rule.field, rule.formula, rule.explain(spec)) for rule in RULES if not rule.holds(spec)]


def check_spec(spec: Spec) -> None:
    """Raise the first ``TopologyError`` of ``violations(spec)``."""
    found = violations(spec)
    if found:
        raise found[0]
