"""Parity engine benchmark at the scale of the Qwen3-235B golden (prints measured ratios).

Synthetic surfaces: 64 policy + 8 rollout ranks, 3 iterations, ~300 operator names
per phase, ~2000 collectives per rank per step, ~40 training metrics, 3 x 64 x 16
rollouts. Golden and actual are written as surface files and loaded separately (no
shared objects). Figures:

* compare / json.load: ``compare()`` time over the time to ``json.load`` the same
  golden + actual files (goal <= 2x);
* whole-document DeepDiff / compare: DeepDiff of every full document (same options
  as the engine) over ``compare()`` (goal >= 10x);

for the identical case, a case with a few planted differences and a case with one
collective inserted in one phase of every policy rank (every collectives section
differs; the sequence diff aligns each in a linear scan).

    python3 benches/parity_bench.py [--scale small] [--repeat 3] [--skip-deepdiff]
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

from harness.parity import compare
from harness.parity.synthetic import QWEN3_235B, SMALL, synthetic_surfaces
from harness.surfaces import surface_file_bytes


def best_of(repeat: int, fn) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def plant_differences(docs: dict) -> dict:
    """One operator count, one collective, one loss value and one missing rollout."""
    out = copy.deepcopy(docs)
    op_sections = sorted(out["operators"]["sections"])
    ops = out["operators"]["sections"][op_sections[len(op_sections) // 4]]["phases"]["train/step2"]["operators"]
    ops[sorted(ops)[5]] += 1
    coll_sections = sorted(out["collectives"]["sections"])
    middle = coll_sections[len(coll_sections) // 2]
    coll = out["collectives"]["sections"][middle]["phases"]["train/step1"]["collectives"]
    coll[min(1234, len(coll) - 1)] = ["all_to_all_single", "ep", "bfloat16", 4096]
    out["training"]["sections"]["step0002"]["metrics"]["loss"] += 1e-3
    del out["rollouts"]["sections"][sorted(out["rollouts"]["sections"])[7]]
    return out


def insert_collective_per_rank(docs: dict) -> dict:
    """One extra collective (a debug barrier) inserted in train/step1 of every policy rank."""
    out = copy.deepcopy(docs)
    for sid, body in out["collectives"]["sections"].items():
        phase = body["phases"].get("train/step1")
        if sid.startswith("policy/") and phase is not None:
            coll = phase["collectives"]
            coll.insert(len(coll) // 2, ["barrier", "default_pg", "float32", 1])
    return out


def write_all(directory: Path, docs: dict) -> dict[str, Path]:
    directory.mkdir(parents=True)
    paths = {}
    for name, doc in docs.items():
        paths[name] = directory / f"{name}.json"
        paths[name].write_bytes(surface_file_bytes(doc))
    return paths


def load_all(paths: dict[str, Path]) -> dict:
    out = {}
    for name, path in paths.items():
        with open(path, "rb") as handle:
            out[name] = json.load(handle)
    return out


def whole_document_deepdiff(golden: dict, actual: dict) -> int:
    from deepdiff import DeepDiff

    count = 0
    for name in sorted(set(golden) | set(actual)):
        diff = DeepDiff(golden.get(name), actual.get(name), zip_ordered_iterables=True, threshold_to_diff_deeper=0)
        count += sum(len(v) for v in diff.values())
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=("235b", "small"), default="235b")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-deepdiff", action="store_true")
    args = parser.parse_args()
    scale = QWEN3_235B if args.scale == "235b" else SMALL

    start = time.perf_counter()
    golden_docs = synthetic_surfaces("qwen3_235b_synthetic", scale, seed=1)
    cases = {"identical": golden_docs, "planted": plant_differences(golden_docs),
             "inserted": insert_collective_per_rank(golden_docs)}
    print(f"built synthetic surfaces in {time.perf_counter() - start:.1f}s: {scale}")

    with tempfile.TemporaryDirectory() as tmp:
        golden_paths = write_all(Path(tmp) / "golden", golden_docs)
        print("\nsurface        bytes        sections")
        for name, path in sorted(golden_paths.items()):
            print(f"{name:<13} {path.stat().st_size:>12,} {len(golden_docs[name]['sections']):>9}")
        total = sum(p.stat().st_size for p in golden_paths.values())
        print(f"{'total':<13} {total:>12,}")

        print("\ncase       json.load(g+a)  compare   ratio(<=2x)  deepdiff(whole)  speed-up(>=10x)  findings")
        for case, actual_docs in cases.items():
            actual_paths = write_all(Path(tmp) / case, actual_docs)
            load_s, _ = best_of(args.repeat, lambda paths=actual_paths: (load_all(golden_paths), load_all(paths)))
            golden_loaded, actual_loaded = load_all(golden_paths), load_all(actual_paths)
            compare_s, verdict = best_of(args.repeat, lambda g=golden_loaded, a=actual_loaded: compare(g, a))
            if args.skip_deepdiff:
                dd_text, speedup = "skipped", ""
            else:
                dd_s, _ = best_of(1, lambda g=golden_loaded, a=actual_loaded: whole_document_deepdiff(g, a))
                dd_text, speedup = f"{dd_s:>10.2f}s", f"{dd_s / compare_s:>10.1f}x"
            print(f"{case:<10} {load_s:>12.3f}s {compare_s:>8.3f}s {compare_s / load_s:>8.2f}x   {dd_text:>15} "
                  f"{speedup:>16}  {len(verdict.findings):>8} ({verdict.status}; "
                  f"{len(verdict.divergences)} cause(s))")


if __name__ == "__main__":
    main()
