"""``harness.footprint.recorder`` in real processes: what a process imported before the hook, what it
opens after, what a forked child inherits, and which reads are not the code (the code digest)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from harness.footprint.merge import merge_run

PROBE = textwrap.dedent("""
    import os, sys, json
    sys.path.insert(0, sys.argv[2])
    import early_mod                      # before install: counts through sys.modules
    from harness.footprint import recorder
    recorder.install()
    from harness import code_identity
    code_identity.digest()                # hashes every harness file: not recorded
    run_a, run_b = sys.argv[1] + "/a", sys.argv[1] + "/b"
    os.makedirs(run_a); os.makedirs(run_b)
    recorder.bind(run_a)
    open(os.path.join(sys.argv[2], "data.txt")).read()
    pid = os.fork()
    if pid == 0:                          # a zygote's child: inherits the hook and what was seen
        os.environ["HARNESS_TRACE_DIR"] = run_b
        import child_mod                  # the hook rebinds to run b by itself
        os._exit(0)
    os.waitpid(pid, 0)
    import late_mod
""")


def _lines(run: Path) -> dict[str, set[str]]:
    out = {}
    for record in sorted((run / "footprint").glob("*.paths")):
        out[record.name] = set(record.read_text().splitlines())
    return out


def test_a_process_and_its_forked_child_record_what_they_read(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("early_mod", "child_mod", "late_mod"):
        (src / f"{name}.py").write_text("X = 1\n")
    (src / "data.txt").write_text("data\n")
    runs = tmp_path / "runs"
    out = subprocess.run([sys.executable, "-c", PROBE, str(runs), str(src)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    a, b = _lines(runs / "a"), _lines(runs / "b")
    assert len(a) == 1 and len(b) == 1, (a.keys(), b.keys())
    (parent,), (child,) = a.values(), b.values()
    assert f"F {src}/early_mod.py" in parent and f"F {src}/data.txt" in parent
    assert any(line.startswith("F ") and "late_mod" in line for line in parent)
    assert not any("child_mod" in line for line in parent)
    # the child: everything the parent had read before the fork, and its own import
    assert f"F {src}/early_mod.py" in child and f"F {src}/data.txt" in child
    assert any("child_mod" in line for line in child) and not any("late_mod" in line for line in child)
    assert f"D {src}" in parent  # the import system listed it: a file added there could be imported
    # code_identity.digest read every harness/*.py; only the modules imported are recorded
    harness_root = Path(__import__("harness").__file__).resolve().parent
    assert f"F {harness_root}/mutations.py" not in parent
    assert f"F {harness_root}/code_identity.py" in parent


def test_merge_keeps_checkout_files_and_resolves_third_party_code(tmp_path: Path):
    import yaml

    import harness

    root = Path(harness.__file__).resolve().parent
    run = tmp_path / "run"
    (run / "footprint").mkdir(parents=True)
    lines = ["P 3.11.7 /x", f"F {root}/model/__pycache__/qwen3_moe.cpython-311.pyc", f"F {root}/ops.py",
             f"D {root}/rollout", f"F {yaml.__file__}", f"F {run}/run.json", "F /proc/self/stat",
             f"F {root.parent}/goldens/numerics-canary.json"]
    (run / "footprint" / "1-1.paths").write_text("\n".join(lines) + "\n")
    doc = merge_run(run)
    assert doc["files"] == ["goldens/numerics-canary.json", "harness/model/qwen3_moe.py", "harness/ops.py"]
    assert doc["dirs"] == ["harness/rollout"]
    from importlib import metadata

    assert doc["distributions"] == {"pyyaml": metadata.version("pyyaml")}
    assert doc["python"] == ["3.11.7"] and doc["external"] == 2 and doc["unresolved"] == []
    json.dumps(doc)
