"""``golden plan WORKLOAD [key=value ...] [--json]``: lay out a workload.

Prints every rank's node, device, coordinates and groups, then the groups of
each kind and a summary (world sizes, group counts, stage layers, parameter
estimate, batch split). Nothing is started. Exit 0, or 2 with a message
naming the field when the spec or the layout is invalid.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.spec.typed import Workload

HELP = "lay out a workload's ranks and process groups (no processes started)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="workload name (goldens/<name>/workload.yaml) or path to a workload.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="spec overrides, YAML-typed")
    parser.add_argument("--option", action="append", default=[], metavar="FIELD=VALUE", dest="run_options",
                        help="a run option, part of the plan (worker_logs, cuda_graphs, decode_kernels, grouped_fp32, "
                             "collective_timeout_s; docs/spec.md, \"The run plan\"); repeatable")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (spec digest, summary, topology)")
    from harness.cli._options import add_goldens_root

    add_goldens_root(parser)


def _fmt_group(group: list[int]) -> str:
    if len(group) > 2 and group == list(range(group[0], group[-1] + 1)):
        return f"[{group[0]}..{group[-1]}]"
    return "[" + ",".join(map(str, group)) + "]"


def summarize(spec: Workload, topo) -> dict:
    """The numbers a reader checks first (also the ``summary`` of --json)."""
    from harness.spec.params import estimate_params

    p, g, plat = spec.policy, spec.grpo, spec.platform
    samples = g.samples_per_step
    per_dp = samples // p.dp
    return {
        "workload": spec.name,
        "policy_world": topo.policy.world,
        "policy_sizes": dict(topo.policy.sizes),
        "rollout_world": topo.rollout.world,
        "rollout_sizes": dict(topo.rollout.sizes),
        "placement": topo.placement,
        "nodes": len(topo.nodes),
        "head_node": plat.head_node,
        "device_nodes": plat.nodes,
        "devices_per_node": plat.gpus_per_node,
        "device": plat.device,
        "devices_used": topo.devices_used,
        "devices_available": plat.nodes * plat.gpus_per_node,
        "stage_layers": list(topo.stage_layers),
        "local_experts": topo.local_experts,
        "group_counts": {k: len(v) for k, v in topo.policy.groups.items()},
        "group_sizes": {k: len(v[0]) for k, v in topo.policy.groups.items()},
        "params": estimate_params(spec.model),
        "samples_per_step": samples,
        "samples_per_dp_rank": per_dp,
        "microbatches_per_dp_rank": per_dp // p.micro_batch_size,
        "iterations": g.iterations,
    }


def _render_text(spec: Workload, digest: str, topo) -> str:
    s = summarize(spec, topo)
    ps, rs = s["policy_sizes"], s["rollout_sizes"]
    head = "1 CPU head + " if s["head_node"] else ""
    lines = [
        f"workload  {s['workload']}   spec {digest[:16]}",
        (f"nodes     {s['nodes']} ({head}{s['device_nodes']} x {s['devices_per_node']} {s['device']}), "
         f"devices used {s['devices_used']}/{s['devices_available']}"),
        (f"policy    world {s['policy_world']} = tp{ps['tp']} x cp{ps['cp']} x dp{ps['dp']} x pp{ps['pp']}; "
         f"expert grid etp{ps['etp']} x ep{ps['ep']} x edp{ps['edp']} per stage; "
         f"{s['local_experts']} local experts/rank; stage layers {s['stage_layers']}"),
        (f"rollout   world {s['rollout_world']} = {rs['engines']} engine(s) x tp{rs['tp']} x pp{rs['pp']}, "
         f"{s['placement']}, {'async' if spec.rollout.is_async else 'sync'} {spec.rollout.backend}"),
        f"params    {s['params']['total']:,} total, {s['params']['active']:,} active",
        (f"batch     {s['samples_per_step']} samples/step = {spec.grpo.prompts_per_step} prompts x "
         f"{spec.grpo.generations_per_prompt} generations; {s['samples_per_dp_rank']} per dp rank "
         f"= {s['microbatches_per_dp_rank']} micro-batches of {spec.policy.micro_batch_size}; "
         f"{s['iterations']} iterations"),
        "groups    " + "  ".join(f"{k} {s['group_counts'][k]}x{s['group_sizes'][k]}" for k in topo.policy.groups),
        "",
    ]
    policy_coords = (("tp", "cp", "dp", "pp", "etp", "ep", "edp"), ("tp", "dp_cp", "pp", "ep", "edp"))
    layouts = [(topo.policy, *policy_coords), (topo.rollout, ("engine", "tp", "pp"), ("tp", "engine"))]
    if topo.teacher is not None:  # a distillation workload's teacher (docs/distill.md)
        d, ts = spec.distill, topo.teacher.sizes
        lines.insert(4, f"teacher   world {topo.teacher.world} = tp{ts['tp']} x dp{ts['dp']} (ep{ts['ep']}), "
                        f"seed {d.teacher.seed}, own ranks on devices {[r.device for r in topo.teacher.ranks]}; "
                        f"kl_coef {d.kl_coef} ({d.kl_direction} KL, {d.kl_type})")
        layouts.append((topo.teacher, *policy_coords))
    for layout, coord_names, kinds in layouts:
        lines.append(f"{layout.role} ranks")
        header = ["rank", "node", "dev", *coord_names, *(f"{k} group" for k in kinds)]
        rows = []
        for info in layout.ranks:
            groups = layout.groups_of(info.rank)
            rows.append([str(info.rank), str(info.node), str(info.device),
                         *(str(info.coords[c]) for c in coord_names),
                         *(_fmt_group(groups[k]) for k in kinds)])
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        lines.append("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths)))
        lines.extend("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)
        lines.append("")
        lines.append(f"{layout.role} groups")
        for kind, groups in layout.groups.items():
            lines.append(f"  {kind:9s} {len(groups)} x {len(groups[0])}: " + " ".join(_fmt_group(g) for g in groups))
        lines.append("")
    if topo.engines:
        lines.append("rollout engines  " + "  ".join(
            f"engine {e.engine}: rank_prefix {e.rank_prefix}, ranks {_fmt_group(list(e.ranks))}" for e in topo.engines))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from harness.spec import SpecError, spec_digest
    from harness.spec.runplan import build_plan

    try:  # the layout, resource and value rules of a run; not what only this machine decides
        # (the runnable check: a planned-only spec names a task no worker here runs; the packages)
        run_plan = build_plan(args.workload, args.overrides, platform="", goldens_root=args.goldens_root,
                              runnable=False, packages=False, options=args.run_options)
    except SpecError as exc:
        print(f"golden plan: {exc}", file=sys.stderr)
        return 2
    spec, topo, resources = run_plan.workload, run_plan.topology, run_plan.resources
    digest = spec_digest(spec)
    if args.json:
        doc = {"workload": spec.name, "spec_digest": digest, "summary": summarize(spec, topo),
               "topology": topo.to_dict(),
               "resources": {"parameters": resources.parameters, "total_bytes": resources.total_bytes,
                             "policy_rank_bytes": resources.policy_rank_bytes,
                             "activation_rank_bytes": resources.activation_rank_bytes,
                             "kv_engine_bytes": resources.kv_engine_bytes}}
        print(json.dumps(doc, indent=1, sort_keys=True))
    else:
        print(_render_text(spec, digest, topo))
        print(f"resources (estimate)  {resources.summary()}")
    return 0
