"""The import graph of ``harness/`` has no cycles, and no new backend-name string compares.

The graph is read statically with ``ast`` (nothing is imported, so the test is cheap and
sees every module, also those whose dependencies are not installed):

* **Modules**: every ``import`` counts, at module level *and* inside functions. A deferred
  (function-level) import still means each module needs the other; it only hides the
  circle until a call happens (the ``seed_rank`` circle between the native and the
  megatron policy engines was of that kind). ``if TYPE_CHECKING:`` blocks never run and
  do not count.
* **Top-level packages** (``harness.model``, ``harness.parallel``, ...; a module directly
  under ``harness/`` is its own node): module-level imports only. This is the layering of
  docs/design.md's package map (what a package needs in order to load). Deferred imports
  across packages are how a module reaches a component chosen at run time or keeps its
  module-level imports light (``flows.py`` -> ``cli/hints.py`` at call time, while the CLI
  loads ``flows`` lazily); the module graph above still refuses any circle they close.

Backend names are the ``policy.backend`` / ``rollout.backend`` enums of the workload
schema. A compare (``==``, ``!=``, ``in``, ``not in``) or ``match`` case against one of
them is a backend switch, and there is none: the backend registries
(``harness/registry/``: one per role, keyed by the backend name) hold what differs
between backends; code reads the selected entry instead of comparing names.

Refit transport names (``rollout.refit.transport``: ``zmq``, ``broadcast``) likewise: the
transport is a registry role (``harness/registry/refit.py``), chosen once from the plan;
outside ``harness/registry/`` no code compares a transport name.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[2] / "harness"

# Backend-name compares allowed, per file (at most this many each): none. A backend is
# selected by its registry entry (harness/registry/), which is keyed by the name.
BACKEND_COMPARES_ALLOWED: dict[str, int] = {}

Edge = tuple[str, str, str]  # (importer, imported, "file:line")


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``), for every ``.py`` under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.AST, deferred: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs inside a function (deferred)."""
    for child in ast.iter_child_nodes(tree):
        if _is_type_checking(child):
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, deferred
        yield from _imports(child, deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def import_edges(root: Path) -> tuple[list[Edge], list[Edge]]:
    """(module-level edges, deferred edges) between the modules under ``root``."""
    modules = _modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    top, deferred = [], []
    for module, (path, is_pkg) in modules.items():
        package = module if is_pkg else module.rpartition(".")[0]
        for node, later in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [resolve(alias.name) for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [resolve(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base) for a in node.names]
            where = f"{path.relative_to(root.parent)}:{node.lineno}"
            for target in targets:
                if target is not None and target != module:
                    (deferred if later else top).append((module, target, where))
    return top, deferred


def find_cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One cycle (as its edges) per strongly connected component with more than one node."""
    graph: dict[str, dict[str, str]] = {}
    for a, b, where in edges:
        graph.setdefault(a, {}).setdefault(b, where)
        graph.setdefault(b, {})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in components:  # a shortest way from the component's first node back to it
        members, start = set(comp), comp[0]
        paths: dict[str, list[Edge]] = {start: []}
        order = [start]
        for v in order:  # breadth first; the list grows while it is read
            if start in graph[v]:
                cycles.append([*paths[v], (v, start, graph[v][start])])
                break
            for w in sorted(graph[v]):
                if w in members and w not in paths:
                    paths[w] = [*paths[v], (v, w, graph[v][w])]
                    order.append(w)
    return cycles


def package_edges(edges: list[Edge]) -> list[Edge]:
    """The edges between top-level packages (``harness.x``; a module directly under the root is its own)."""

    def top(module: str) -> str:
        return ".".join(module.split(".")[:2])

    return [(top(a), top(b), where) for a, b, where in edges if top(a) != top(b)]


def _render(cycles: list[list[Edge]]) -> str:
    return "\n".join(" -> ".join(f"{a} ({where})" for a, _, where in c) + f" -> {c[0][0]}" for c in cycles)


def backend_names() -> set[str]:
    schema = json.loads((HARNESS / "spec" / "workload.schema.json").read_text())
    roles = ("policy", "rollout")
    return {name for role in roles for name in schema["properties"][role]["properties"]["backend"]["enum"]}


def backend_compares(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines of compares or ``match`` cases against a backend-name string."""

    def strings(node: ast.AST) -> Iterator[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            for element in node.elts:
                yield from strings(element)

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            sides = [node.value]
        else:
            continue
        if any(s in names for side in sides for s in strings(side)):
            lines.append(node.lineno)
    return lines


# -- the checks on harness/ -----------------------------------------------------------------


def test_no_import_cycle_between_modules():
    top, deferred = import_edges(HARNESS)
    assert len(top) > 300 and deferred, "the graph reader found (almost) no imports"
    cycles = find_cycles(top + deferred)
    assert not cycles, f"import cycles between harness modules (module-level and deferred imports):\n{_render(cycles)}"


def test_no_import_cycle_between_top_level_packages():
    top, _ = import_edges(HARNESS)
    cycles = find_cycles(package_edges(top))
    assert not cycles, f"import cycles between harness packages (module-level imports):\n{_render(cycles)}"


def test_backend_names_are_compared_nowhere_new():
    names = backend_names()
    assert {"native", "megatron", "vllm"} <= names
    found = {}
    for path in sorted(HARNESS.rglob("*.py")):
        lines = backend_compares(ast.parse(path.read_text(), filename=str(path)), names)
        if lines:
            found[path.relative_to(HARNESS).as_posix()] = lines
    extra = {f: lines for f, lines in found.items() if len(lines) > BACKEND_COMPARES_ALLOWED.get(f, 0)}
    assert not extra, (
        f"backend-name string compares beyond the allow-list (file: lines): {extra}; "
        "select the backend through its registry instead"
    )


def transport_names() -> set[str]:
    schema = json.loads((HARNESS / "spec" / "workload.schema.json").read_text())
    enum = schema["properties"]["rollout"]["properties"]["refit"]["properties"]["transport"]["enum"]
    return set(enum) - {"auto"}  # auto: resolved by the registry, no transport of its own


def test_transport_names_are_compared_only_in_the_registry():
    names = transport_names()
    assert names == {"zmq", "broadcast"}
    found = {}
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS).as_posix()
        lines = backend_compares(ast.parse(path.read_text(), filename=str(path)), names)
        if lines and not rel.startswith("registry/"):
            found[rel] = lines
    assert not found, (f"refit transport-name string compares outside harness/registry/ (file: lines): {found}; "
                       "select the transport through harness.registry.refit instead")


# -- the readers themselves catch what they must (planted trees) ---------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


@pytest.mark.parametrize("importer", ["import pkg.a\n", "from pkg import a\n", "from . import a\n",
                                      "def later():\n    from pkg.a import f\n"])
def test_a_planted_module_cycle_is_found(tmp_path, importer):
    root = _tree(tmp_path, {"__init__.py": "", "a.py": "from pkg.b import g\n", "b.py": importer,
                            "c.py": "if TYPE_CHECKING:\n    import pkg.a\n"})
    top, deferred = import_edges(root)
    (cycle,) = find_cycles(top + deferred)
    assert {a for a, _, _ in cycle} == {"pkg.a", "pkg.b"}
    assert not find_cycles(top) if importer.startswith("def") else find_cycles(top)


def test_a_planted_package_cycle_is_found(tmp_path):
    root = _tree(tmp_path, {"__init__.py": "", "x/__init__.py": "", "y/__init__.py": "",
                            "x/m.py": "from pkg.y import n\n", "y/n.py": "from pkg.x.p import f\n", "x/p.py": ""})
    top, _ = import_edges(root)
    assert not find_cycles(top)  # no module circle ...
    (cycle,) = find_cycles(package_edges(top))
    assert {a for a, _, _ in cycle} == {"pkg.x", "pkg.y"}  # ... but a package one


@pytest.mark.parametrize("source, hits", [
    ('if spec["rollout"]["backend"] == "vllm":\n    pass\n', 1),
    ('ok = backend not in ("native", "vllm")\n', 1),
    ('match backend:\n    case "megatron":\n        pass\n', 1),
    ('if mode == "fused" or x == "nativeish":\n    pass\n', 0),
])
def test_backend_compare_reader(source, hits):
    assert len(backend_compares(ast.parse(source), {"native", "megatron", "vllm"})) == hits
