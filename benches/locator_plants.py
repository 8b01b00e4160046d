"""Planted numeric changes for the first-divergence locator (docs/locator.md).

Each plant is a real code change applied to a scratch copy of the tree (``git archive HEAD``
into a temporary folder; this repository is never edited): the router's top-k tie-break in
one layer, the RoPE base, the attention scale in one layer's backward only, one expert's
initial weights. For each plant and workload the script

1. captures a baseline golden of HEAD into a temporary goldens root (once per workload),
2. runs ``golden check`` of the scratch copy against it (``PYTHONPATH`` = the copy, so the
   driver and every Ray worker import the planted code),
3. prints the first finding (the first diverging module) and its consequence counts,
4. with ``--locate``, runs ``golden locate`` of the scratch copy on that run (``--repo`` this
   checkout, which holds the baseline's commit) and prints the aten op it names and its file:line.

Usage::

    .venv/bin/python benches/locator_plants.py [--workloads qwen3_moe_tiny_smoke,...] [--plants a,b,c,d] [--locate]

Needs a clean tree (the baseline is HEAD). Wall time: ~25 s per smoke run, ~60 s per flagship
run on a quiet 2-core box.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]

class Plant(NamedTuple):
    what: str
    file: str
    old: str
    new: str


PLANTS: dict[str, Plant] = {
    "a": Plant(
        what=("router top-k tie-break in layer 2 (top-k on bf16-rounded probabilities: near-ties go to the "
              "lower expert index)"),
        file="harness/parallel/expert.py",
        old="        _, w, idx = ops.route(logits, top_k, norm_topk_prob)\n",
        new=("        probs, w, idx = ops.route(logits, top_k, norm_topk_prob)\n"
             "        if prefix == \"model.layers.2.mlp\":   # PLANT\n"
             "            idx = torch.topk(probs.to(torch.bfloat16), top_k, dim=-1).indices\n"
             "            w = probs.gather(-1, idx)\n"
             "            w = (w / w.sum(dim=-1, keepdim=True) if norm_topk_prob else w).to(logits.dtype)\n")),
    "b": Plant(
        what=("RoPE base theta -> theta + 1 in the policy model (harness.ops itself is covered by the numerics "
              "canary: a change there reads as environment drift, exit 3)"),
        file="harness/policy/native/parallel_model.py",
        old=("        cos, sin = taps.call(\"model.rotary_emb\", ops.rope_cos_sin, pos, cfg.head_dim, "
             "cfg.rope_theta, hidden.dtype)\n"),
        new=("        cos, sin = taps.call(\"model.rotary_emb\", ops.rope_cos_sin, pos, cfg.head_dim,\n"
             "                             cfg.rope_theta + 1.0, hidden.dtype)   # PLANT\n")),
    "c": Plant(
        what="attention scale in layer 1's backward only (the gradient into q scaled by 1 + 2**-10)",
        file="harness/policy/native/parallel_model.py",
        old=("        attn = taps.call(at + \"attention\", lambda a, c, e: context.cp_attention(\n"
             "            a, c, e, self.positions, self.seq_len, g[\"cp\"], self.cp), q, k, v)\n"),
        new=("        attn = taps.call(at + \"attention\", lambda a, c, e: context.cp_attention(\n"
             "            _BwdScale.apply(a) if i == 1 else a, c, e, self.positions, self.seq_len, g[\"cp\"],\n"
             "            self.cp), q, k, v)   # PLANT\n")),
    "d": Plant(
        what="one expert's initial weights (layer 1, expert 5, gate_proj[0, 0] one ulp up, policy only)",
        file="harness/policy/native/parallel_model.py",
        old="            self._params[name.replace(\".\", \"|\")] = nn.Parameter(local.detach().clone())\n",
        new=("            local = local.detach().clone()\n"
             "            if name == \"model.layers.1.mlp.experts.5.gate_proj.weight\":   # PLANT\n"
             "                up = torch.tensor(float(\"inf\"), dtype=local.dtype)\n"
             "                local[0, 0] = torch.nextafter(local[0, 0], up)\n"
             "            self._params[name.replace(\".\", \"|\")] = nn.Parameter(local)\n")),
}

# plant c needs the backward-only scale itself (appended to the module it patches)
_BWD_SCALE = '''

class _BwdScale(torch.autograd.Function):   # PLANT: identity forward, scaled gradient
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * (1.0 + 2.0 ** -10)
'''


def _scratch(plant: str, base: Path) -> Path:
    rel, old, new = PLANTS[plant].file, PLANTS[plant].old, PLANTS[plant].new
    tree = base / f"tree-{plant}"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    path = tree / rel
    text = path.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"plant {plant}: the text to change is not found once in {rel} (the code moved)")
    text = text.replace(old, new)
    if plant == "c":
        text += _BWD_SCALE
    path.write_text(text)
    return tree


def _golden(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True, text=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="qwen3_moe_tiny_smoke,qwen3_moe_tiny_tp2pp2cp2ep2")
    ap.add_argument("--plants", default="a,b,c,d")
    ap.add_argument("--locate", action="store_true", help="also run golden locate on each plant's run")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder and print its path")
    opts = ap.parse_args()
    if subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip():
        print("locator_plants: the tree is dirty; the baseline is HEAD, commit first", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="locator-plants-"))
    root = base / "goldens"
    env = dict(os.environ)
    rows = []
    try:
        for workload in opts.workloads.split(","):
            (root / workload).mkdir(parents=True)
            shutil.copy(ROOT / "goldens" / workload / "workload.yaml", root / workload / "workload.yaml")
            cap = _golden(["capture", workload, "--goldens-root", str(root), "--platform", "cpu", "-q",
                           "--run-dir", str(base / f"base-{workload}")], env, ROOT)
            if cap.returncode != 0:
                print(cap.stdout[-2000:], cap.stderr[-2000:], file=sys.stderr)
                return 3
        for plant in opts.plants.split(","):
            tree = _scratch(plant, base)
            penv = dict(env, PYTHONPATH=str(tree))
            for workload in opts.workloads.split(","):
                run_dir = base / f"run-{plant}-{workload}"
                check = _golden(["check", workload, "--goldens-root", str(root), "--platform", "cpu", "-q",
                                 "--run-dir", str(run_dir)], penv, tree)
                verdict = _golden(["diff", str(run_dir), str(root / workload / "cpu"), "--format", "json"], penv, tree)
                first = "(no verdict)"
                counts = {}
                try:
                    doc = json.loads(verdict.stdout)
                    d = doc["first_divergence"][0]
                    cause = d["cause"]
                    first = cause.get("note") or f"{cause['surface']} {cause['section']} {cause['key']}"
                    counts = d["consequence_counts"]
                except (ValueError, KeyError, IndexError):
                    pass
                rows.append((plant, workload, check.returncode, first, counts))
                print(f"[{plant}] {PLANTS[plant].what}\n  {workload}: exit {check.returncode}\n  first: {first}\n"
                      f"  consequences: {counts}", flush=True)
                if opts.locate:
                    loc = _golden(["locate", str(run_dir), str(root / workload / "cpu"), "--repo", str(ROOT),
                                   "--format", "json"], penv, tree)
                    try:
                        op = json.loads(loc.stdout)
                        named = (f"{op['op']['op']} ({op['op']['phase']}) at {op['op']['where']}" if op.get("op")
                                 else f"no op named: {op.get('reason')}")
                        if op.get("counterpart"):
                            named += (f"; non-tensor arguments {op['op']['args']}, the golden's "
                                      f"{op['counterpart']['args']}")
                        named += f"; then {[t['op'] for t in op.get('then') or ()]}"
                    except (ValueError, KeyError, TypeError):
                        named = f"(no report) {loc.stderr[-1500:]}"
                    print(f"  golden locate: exit {loc.returncode}: {named}", flush=True)
    finally:
        if opts.keep:
            print(f"scratch kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
