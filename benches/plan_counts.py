"""How often a run works its plan out, and the static counts of issue 42.

``python benches/plan_counts.py`` prints the static counts, read from the source with
``ast`` (nothing imported):

* ``as_workload`` calls outside ``harness/spec/``;
* two-way package pairs: top-level packages of ``harness`` that import each other at
  module level (``suites/unit/test_import_graph.py`` reads the same graph);
* function-level import statements (any module; nested functions counted once);
* environment variable names of the project's own: distinct string literals spelled
  ``HARNESS_*``, ``GOLDEN_*`` or ``NRL_*`` in the package;
* backend tables outside the registry: module-level assignments outside
  ``harness/registry/`` whose value names two or more backends (``policy.backend`` /
  ``rollout.backend`` names of the schema file) as dict keys or as the first argument of
  a call (``ENVIRONMENTS``, ``FLAVOURS`` before issue 42; a backend is declared once, in
  its registry record, and those tables are read from the records);
* transport-name string compares outside ``harness/registry/``: ``==`` / ``!=`` / ``in``
  / ``match`` against a ``rollout.refit.transport`` name (``zmq``, ``broadcast``; the
  reader of ``suites/unit/test_import_graph.py``).

``python benches/plan_counts.py --run`` also runs the smoke workload once (one iteration,
CPU, in this process: ``golden run qwen3_moe_tiny_smoke grpo.iterations=1``) under ``cProfile`` and prints how often the
driver called each step of working the plan out: a workload file read
(``yaml_io.load_yaml_file``), a spec validation (``load.spec_from_dict``), a layout plan
(``topology.plan``), a layout check (``constraints.check_spec``), the resource estimate
(``resources.estimate``), the runnable check (``load.check_runnable``), ``as_workload``.
Worker processes are not counted (they receive the plan as a value). Counts, not times:
nothing here is timed.

``python benches/plan_counts.py --pytest`` counts the same steps in one pytest process running
the smoke workload's golden tests (``pytest -m golden -k "qwen3_moe_tiny_smoke and not
mutation"``: collection, the pre-run verdicts, the run, the comparison).
"""

from __future__ import annotations

import argparse
import ast
import cProfile
import json
import pstats
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "harness"
ENV_NAME = re.compile(r"(HARNESS|GOLDEN|NRL)_[A-Z0-9_]*[A-Z0-9]")  # a variable name of the project's own

# (label, module file suffix, function name)
RUN_STEPS = (
    ("workload file reads", "harness/spec/yaml_io.py", "load_yaml_file"),
    ("spec validations", "harness/spec/load.py", "spec_from_dict"),
    ("layout plans", "harness/spec/topology.py", "plan"),
    ("layout checks", "harness/spec/constraints.py", "check_spec"),
    ("resource estimates", "harness/spec/resources.py", "estimate"),
    ("runnable checks", "harness/spec/load.py", "check_runnable"),
    ("as_workload calls", "harness/spec/typed.py", "as_workload"),
    ("run plans built", "harness/spec/runplan.py", "build_plan"),
)


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def _imported(node: ast.AST, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")[: -node.level] if not module.endswith("__init__") else module.split(".")
            return [".".join([*base, node.module or ""]).rstrip(".")]
        return [node.module or ""]
    return []


def _schema_enum(*path: str) -> list[str]:
    node = json.loads((HARNESS / "spec" / "workload.schema.json").read_text())
    for key in path:
        node = node["properties"][key]
    return node["enum"]


def _strings(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from _strings(element)


def _compares(tree: ast.AST, names: set[str]) -> int:
    """Compares or ``match`` cases against one of ``names``."""
    n = 0
    for node in ast.walk(tree):
        sides = ([node.left, *node.comparators] if isinstance(node, ast.Compare)
                 else [node.value] if isinstance(node, ast.MatchValue) else [])
        n += any(s in names for side in sides for s in _strings(side))
    return n


def _names_backends(value: ast.AST, names: set[str]) -> bool:
    """Whether a module-level value names two or more backends as dict keys or first call arguments."""
    found: set[str] = set()
    for node in ast.walk(value):
        if isinstance(node, ast.Dict):
            found |= {k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in names}
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in names:
            found.add(node.args[0].value)
    return len(found) >= 2


def static_counts() -> dict[str, int]:
    """The static counts (see the module docstring)."""
    mods = _modules()
    as_workload = 0
    function_imports = 0
    env_names: set[str] = set()
    pkg_edges: set[tuple[str, str]] = set()
    backends = set(_schema_enum("policy", "backend")) | set(_schema_enum("rollout", "backend"))
    transports = set(_schema_enum("rollout", "refit", "transport")) - {"auto"}
    backend_tables = transport_compares = 0
    for name, tree in mods.items():
        in_spec = name.startswith("harness.spec")
        if not name.startswith("harness.registry"):
            transport_compares += _compares(tree, transports)
            backend_tables += sum(1 for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                                  and node.value is not None and _names_backends(node.value, backends))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if called == "as_workload" and not in_spec:
                    as_workload += 1
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and ENV_NAME.fullmatch(node.value):
                env_names.add(node.value)
        for node in tree.body:  # module level (not under TYPE_CHECKING)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            for sub in ([node] if isinstance(node, (ast.Import, ast.ImportFrom)) else []):
                for target in _imported(sub, name):
                    if target.startswith("harness.") and _package(target) != _package(name):
                        pkg_edges.add((_package(name), _package(target)))
        inside = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}
        function_imports += len(inside)
    two_way = {tuple(sorted(e)) for e in pkg_edges if (e[1], e[0]) in pkg_edges}
    return {
        "as_workload calls outside spec/": as_workload,
        "two-way package pairs (module level)": len(two_way),
        "function-level imports": function_imports,
        "own environment variable names": len(env_names),
        "backend tables outside the registry": backend_tables,
        "transport-name compares outside the registry": transport_compares,
    }


def run_counts() -> dict[str, int]:
    """Run the smoke workload once in this process under cProfile; count the plan steps."""
    sys.path.insert(0, str(ROOT))
    from harness.cli import main

    profile = cProfile.Profile()
    with tempfile.TemporaryDirectory() as tmp:
        profile.enable()
        try:
            code = main(["run", "qwen3_moe_tiny_smoke", "grpo.iterations=1", "--run-dir", str(Path(tmp) / "run"),
                         "-q"])
        finally:
            profile.disable()
        if code != 0:
            raise SystemExit(f"golden run exited {code}")
    return _step_counts(profile)


def pytest_counts() -> dict[str, int]:
    """The smoke workload's golden tests in this process under cProfile; count the plan steps."""
    import pytest

    sys.path.insert(0, str(ROOT))
    profile = cProfile.Profile()
    profile.enable()
    try:
        code = pytest.main(["-q", "-m", "golden", "-k", "qwen3_moe_tiny_smoke and not mutation",
                            "-p", "no:cacheprovider",
                            str(ROOT / "suites")])
    finally:
        profile.disable()
    if code != 0:
        raise SystemExit(f"pytest exited {code}")
    return _step_counts(profile)


def _step_counts(profile: cProfile.Profile) -> dict[str, int]:
    stats = pstats.Stats(profile).stats
    counts = {label: 0 for label, _, _ in RUN_STEPS}
    for (file, _line, func), (_cc, ncalls, *_rest) in stats.items():
        for label, suffix, name in RUN_STEPS:
            if func == name and file.replace("\\", "/").endswith(suffix):
                counts[label] += ncalls
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="also count the plan steps of one smoke run")
    parser.add_argument("--pytest", action="store_true",
                        help="also count them in a pytest process running the smoke workload's golden tests")
    args = parser.parse_args()
    for label, n in static_counts().items():
        print(f"{label:45s} {n}")
    if args.run:
        print("-- one smoke run (qwen3_moe_tiny_smoke, grpo.iterations=1), driver process --")
        for label, n in run_counts().items():
            print(f"{label:45s} {n}")
    if args.pytest:
        print('-- pytest -m golden -k "qwen3_moe_tiny_smoke and not mutation", pytest process --')
        for label, n in pytest_counts().items():
            print(f"{label:45s} {n}")


if __name__ == "__main__":
    main()
