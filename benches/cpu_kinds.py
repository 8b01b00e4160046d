"""The numerics canary on this machine under three process states, for the machine-kind table.

Each arm is a fresh interpreter running ``python -m harness.portable.canary``:

* ``pinned``: the harness's pins (``harness.portable.pins.PINS``) and the portable kernels,
  what every golden run's process has;
* ``pins_only``: the same variables without the portable kernels (``GOLDEN_CANARY_NO_KERNELS=1``),
  to show what the kernels add;
* ``unpinned``: none of the variables (the machine's own code paths).

Run it on two machines and compare the JSON files op by op (``--compare A.json B.json``):

    python benches/cpu_kinds.py > amd.json
    python benches/cpu_kinds.py --compare amd.json intel.json

CUDA is hidden from the children, so on a GPU machine only its host CPU's kernels run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.numerics import first_processor  # noqa: E402  (standard library only)
from harness.portable.pins import OFF_VAR, PINS  # noqa: E402

OVERRIDING = (*PINS, "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE", "DNNL_MAX_CPU_ISA", OFF_VAR)


def _cpu() -> dict[str, str]:
    fields = first_processor()
    flags = set(fields.get("flags", "").split())
    return {"model_name": fields.get("model name", "?"), "vendor": fields.get("vendor_id", "?"),
            "family": fields.get("cpu family", "?"), "model": fields.get("model", "?"),
            "avx512f": str("avx512f" in flags), "amx": str("amx_tile" in flags)}


def arm(name: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in OVERRIDING}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    if name in ("pinned", "pins_only"):
        env.update(PINS)
    if name == "pins_only":
        env["GOLDEN_CANARY_NO_KERNELS"] = "1"
    if name == "unpinned":
        env[OFF_VAR] = "0"
    out = subprocess.run([sys.executable, "-m", "harness.portable.canary"], env=env, capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    if out.returncode != 0:
        return {"error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(a_path: str, b_path: str) -> int:
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    print(f"A: {a['cpu']['model_name']} ({a['cpu']['vendor']} f{a['cpu']['family']}m{a['cpu']['model']})")
    print(f"B: {b['cpu']['model_name']} ({b['cpu']['vendor']} f{b['cpu']['family']}m{b['cpu']['model']})")
    for name in a["arms"]:
        ops_a, ops_b = a["arms"][name].get("ops", {}), b["arms"].get(name, {}).get("ops", {})
        differ = [op for op in ops_a if ops_a[op] != ops_b.get(op)]
        print(f"{name:10s} {len(ops_a) - len(differ)}/{len(ops_a)} equal; differ: {', '.join(differ) or '-'}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"))
    parser.add_argument("--arms", default="pinned,pins_only,unpinned")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    print(json.dumps({"cpu": _cpu(), "arms": {name: arm(name) for name in args.arms.split(",")}}, indent=1,
                     sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
