"""The ``distill:`` block: the teacher's own spec, its layout rules and its ranks (gate half, pure).

A distillation workload (``grpo.trainer: distill``) runs a second Qwen3-MoE,
the teacher, in a policy group of its own. :func:`teacher_spec` derives the
spec its workers are built from: the student's spec with the teacher's model
fields, seed and layout (native backend, ``pp = cp = etp = 1``, sequence
parallel when ``tp > 1``, the student's ``seq_len``) and a minimal rollout
block (the teacher generates nothing). :func:`violations` checks, in order:

* ``grpo.trainer`` is ``distill`` exactly when a ``distill`` block is given;
* ``policy.backend`` is ``native`` (the distillation loss rides the native
  engine's loss) and ``grpo.loss.token_level_loss`` is on (the KL term is a
  token mean);
* the teacher's vocab is the student's (``distill.teacher.model.vocab``);
* every layout rule of ``harness.spec.constraints`` on the teacher's spec, the
  field renamed into the block (``policy.tp`` -> ``distill.teacher.tp``,
  ``model.heads`` -> ``distill.teacher.model.heads``);
* the platform holds the teacher's ranks too (they take the device slots after
  the student's and, when separate, the rollout's: ``platform.nodes``).

``harness.spec.topology.plan`` lays the teacher's ranks out as role ``teacher``
(the topology surface's section of that name).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from harness.registry.policy import POLICY_BACKENDS
from harness.spec.errors import TopologyError

Spec = dict[str, Any]

TEACHER_ROLE = "teacher"
# the student backends whose loss the KL term rides (their records' ``distill``, harness.registry.policy)
DISTILL_POLICY_BACKENDS = tuple(n for n, b in POLICY_BACKENDS.items() if b.distill)
# Student policy fields the teacher takes from the distill block (the rest are fixed or the student's).
_LAYOUT_FIELDS = ("tp", "ep", "dp", "micro_batch_size")


def has_distill(spec: Spec) -> bool:
    return spec.get("distill") is not None


def teacher_spec(spec: Spec) -> Spec:
    """The spec the teacher's workers are built from (a new dict; ``spec`` is not modified)."""
    d = spec["distill"]["teacher"]
    out = copy.deepcopy(dict(spec))  # plain dicts, also from a read-only loaded spec
    out["seed"] = int(d["seed"])
    out["model"] = {**spec["model"], **d.get("model", {})}
    tp = int(d.get("tp", 1))
    out["policy"] = {
        **spec["policy"],
        "backend": "native", "tp": tp, "pp": 1, "cp": 1, "ep": int(d.get("ep", 1)), "etp": 1,
        "dp": int(d.get("dp", 1)), "sp": tp > 1, "pp_layout": None,
        "micro_batch_size": int(d.get("micro_batch_size", 2)),
    }
    out["policy"].pop("lora", None)
    out["rollout"] = {**spec["rollout"], "engines": 1, "tp": 1, "pp": 1, "ep": 1, "colocated": True,
                      "backend": "native"}
    out.pop("distill", None)
    out["grpo"] = {**spec["grpo"], "trainer": "sync"}
    return out


def teacher_world(spec: Spec) -> int:
    d = spec["distill"]["teacher"]
    return int(d.get("tp", 1)) * int(d.get("dp", 1))


def _rename(field: str) -> str:
    if field.startswith("policy."):
        return "distill.teacher." + field[len("policy."):]
    if field.startswith("model."):
        return "distill.teacher.model." + field[len("model."):]
    return field


def violations(spec: Spec, layout_violations: Callable[[Spec], list[TopologyError]]) -> list[TopologyError]:
    """The distillation rules a loaded spec breaks, in the order of the module docstring;
    ``layout_violations`` is ``harness.spec.constraints``' rule check (passed in: that module
    calls this one)."""
    trainer = spec["grpo"]["trainer"]
    if not has_distill(spec):
        if trainer == "distill":
            return [TopologyError("distill", "grpo.trainer == distill requires a distill block",
                                  "grpo.trainer: distill needs a distill: block naming the teacher")]
        return []
    if trainer != "distill":
        return [TopologyError("grpo.trainer", "a distill block requires grpo.trainer == distill",
                              f"a distill: block is given but grpo.trainer is {trainer!r}; set grpo.trainer: distill")]
    out: list[TopologyError] = []
    if spec["policy"]["backend"] not in DISTILL_POLICY_BACKENDS:
        out.append(TopologyError("policy.backend", "grpo.trainer == distill requires policy.backend == native",
                                 f"distillation runs on the native policy backend, not {spec['policy']['backend']!r}"))
    if not spec["grpo"]["loss"]["token_level_loss"]:
        out.append(TopologyError("grpo.loss.token_level_loss", "grpo.trainer == distill requires token_level_loss",
                                 "the distillation KL term is a token mean; set grpo.loss.token_level_loss: true"))
    tmodel = spec["distill"]["teacher"].get("model", {})
    if "vocab" in tmodel and tmodel["vocab"] != spec["model"]["vocab"]:
        out.append(TopologyError("distill.teacher.model.vocab", "distill.teacher.model.vocab == model.vocab",
                                 f"the teacher's vocab {tmodel['vocab']} differs from the student's "
                                 f"{spec['model']['vocab']}: the KL compares distributions over one vocabulary"))
    tspec = teacher_spec(spec)
    for err in layout_violations(tspec):
        if err.field.startswith(("policy.", "model.")):
            out.append(TopologyError(_rename(err.field), err.rule, f"teacher: {err.message}"))
    plat, p, r = spec["platform"], spec["policy"], spec["rollout"]
    need = p["tp"] * p["pp"] * p["cp"] * p["dp"] + teacher_world(spec)
    if not r["colocated"]:
        need += r["engines"] * r["tp"] * r["pp"]
    if need > plat["nodes"] * plat["gpus_per_node"]:
        out.append(TopologyError("platform.nodes", "devices_needed + teacher world <= nodes * gpus_per_node",
                                 f"the student, rollout and teacher need {need} devices but the platform has "
                                 f"{plat['nodes']} x {plat['gpus_per_node']}"))
    return out

