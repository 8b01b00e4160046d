"""Stand-alone import probe for ``golden doctor`` (standard library only).

Run as a script in a worker's interpreter, so it works even where the harness
itself is not installed::

    python probe.py --class-path pkg.module.Class --methods begin,finish,close

Prints one JSON line ``{"ok", "error", "python", "module_file"}`` and exits 0
when the class imports, is a class and has every method; 1 otherwise. The
class is never constructed (constructors may need a run directory).

``static_probe`` answers the same question in *this* interpreter without
importing the plugin's module (``golden run`` / ``check`` use it before Ray
starts): it finds the module's source file and reads its top-level definitions.
What it cannot see (a name bound by an import or an assignment, an extension
module, methods inherited from a base class) it accepts; ``golden doctor``
imports for real.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import sys


def probe(class_path: str, methods: list[str]) -> dict[str, object]:
    result: dict[str, object] = {"ok": False, "error": None, "python": sys.executable, "module_file": None}
    module_name, _, class_name = class_path.rpartition(".")
    if not module_name or not class_name or not all(p.isidentifier() for p in class_path.split(".")):
        result["error"] = f"{class_path!r} is not a fully qualified class path 'package.module.ClassName'"
        return result
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - the probe reports any import failure
        result["error"] = f"could not import module {module_name!r}: {type(exc).__name__}: {exc}"
        return result
    result["module_file"] = getattr(module, "__file__", None)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        result["error"] = f"{class_path!r} does not resolve to a class"
        return result
    missing = [m for m in methods if not callable(getattr(cls, m, None))]
    if missing:
        result["error"] = f"{class_path!r} is missing required method(s): {', '.join(missing)}"
        return result
    result["ok"] = True
    return result


def _module_source(module_name: str) -> tuple[str | None, str | None]:
    """(source file of ``module_name`` or None when not a .py file, error) without importing
    it: parent packages are located on the file system, never executed."""
    parts = module_name.split(".")
    spec, search = None, None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        module = sys.modules.get(name)
        if module is not None:
            spec, search = module.__spec__, getattr(module, "__path__", None)
            continue
        try:
            spec = (importlib.util.find_spec(name) if i == 0
                    else importlib.machinery.PathFinder.find_spec(name, search))
        except (ImportError, ValueError) as exc:
            return None, f"could not locate module {name!r}: {exc}"
        if spec is None:
            return None, f"could not import module {module_name!r}: no module named {name!r}"
        search = spec.submodule_search_locations
    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py"):
        return None, None
    return origin, None


def _static_kind(module_name: str, name: str, hops: int = 0) -> tuple[str, object]:
    """What ``module_name.name`` is, read from source: ("class", ClassDef), ("function", None),
    ("module", None), ("missing", None), ("unknown", None) or ("error", message)."""
    if module_name in sys.modules:  # already imported here: look at the object itself
        obj = getattr(sys.modules[module_name], name, None)
        if isinstance(obj, type):
            return "object", obj
        if obj is None:
            return "missing", None
        if inspect.isroutine(obj):  # the same words as the source reading below, whatever was imported before
            return "function", None
        if inspect.ismodule(obj):
            return "module", None
        return "notclass", type(obj).__name__
    origin, error = _module_source(module_name)
    if error:
        return "error", error
    if origin is None:  # an extension or namespace module: only an import can tell
        return "unknown", None
    try:
        with open(origin, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), filename=origin)
    except (OSError, SyntaxError, ValueError) as exc:
        return "error", f"could not import module {module_name!r}: {type(exc).__name__}: {exc}"
    found: tuple[str, object] = ("missing", None)
    package = module_name if origin.endswith("__init__.py") else module_name.rpartition(".")[0]
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            found = ("class", stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
            found = ("function", None)
        elif isinstance(stmt, ast.Import) and any((a.asname or a.name.split(".")[0]) == name for a in stmt.names):
            found = ("module", None)
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) != name:
                    continue
                base = stmt.module or ""
                if stmt.level:
                    parent = package.split(".")[: len(package.split(".")) - stmt.level + 1]
                    base = ".".join([*parent, *([stmt.module] if stmt.module else [])])
                if hops >= 5 or not base:
                    found = ("unknown", None)
                    continue
                kind = _static_kind(base, alias.name, hops + 1)
                if kind[0] == "missing":  # `from pkg import submodule`?
                    sub, _ = _module_source(f"{base}.{alias.name}")
                    kind = ("module", None) if sub else ("unknown", None)
                found = kind if kind[0] != "error" else ("unknown", None)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.If, ast.Try, ast.With, ast.For)) and \
                name in {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}:
            found = ("unknown", None)
    if found[0] == "missing" and origin.endswith("__init__.py"):
        sub, _ = _module_source(f"{module_name}.{name}")
        if sub:
            found = ("module", None)
    return found


def static_probe(class_path: str, methods: list[str] | tuple[str, ...]) -> dict[str, object]:
    """``probe``'s answer in this interpreter without importing the plugin module (see module doc)."""
    result: dict[str, object] = {"ok": False, "error": None, "python": sys.executable, "module_file": None}
    module_name, _, class_name = class_path.rpartition(".")
    if not module_name or not class_name or not all(p.isidentifier() for p in class_path.split(".")):
        result["error"] = f"{class_path!r} is not a fully qualified class path 'package.module.ClassName'"
        return result
    kind, detail = _static_kind(module_name, class_name)
    not_class = f"{class_path!r} does not resolve to a class"
    if kind == "error":
        result["error"] = str(detail)
    elif kind == "missing":
        result["error"] = f"{not_class} (module {module_name!r} defines no {class_name!r})"
    elif kind in ("function", "module"):
        result["error"] = f"{not_class} (it is a {kind})"
    elif kind == "notclass":
        result["error"] = f"{not_class} (got {detail})"
    elif kind == "object":
        missing = [m for m in methods if not callable(getattr(detail, m, None))]
        if missing:
            result["error"] = f"{class_path!r} is missing required method(s): {', '.join(missing)}"
    elif kind == "class" and not detail.bases:
        defined = {n.name for n in detail.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        missing = [m for m in methods if m not in defined]
        if missing:
            result["error"] = f"{class_path!r} is missing required method(s): {', '.join(missing)}"
    result["ok"] = result["error"] is None
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--class-path", required=True)
    parser.add_argument("--methods", default="")
    args = parser.parse_args(argv)
    result = probe(args.class_path, [m for m in args.methods.split(",") if m])
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
