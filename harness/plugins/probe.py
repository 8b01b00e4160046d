"""Stand-alone import probe for ``golden doctor`` (standard library only).

Run as a script in a worker's interpreter, so it works even where the harness
itself is not installed::

    python probe.py --class-path pkg.module.Class --methods begin,finish,close

Prints one JSON line ``{"ok", "error", "python", "module_file"}`` and exits 0
when the class imports, is a class and has every method; 1 otherwise. The
class is never constructed (constructors may need a run directory).
"""

from __future__ import annotations

import argparse
import importlib
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
