"""golden: run GRPO golden workloads, postflight them and gate their surfaces.

Each subcommand lives in its own module ``harness.cli.<name>`` exposing
``HELP: str``, ``add_arguments(parser)`` and ``run(args) -> int``. Modules are
imported only when their subcommand runs, so ``golden plan`` / ``validate`` /
``diff`` never pay for (or need) the workload half.

Exit codes: 0 success / parity, 1 findings or failed check, 2 unusable input.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("harness.cli.list_cmd", "list golden workloads and their platforms"),
    "plan": ("harness.cli.plan", "lay out a workload's ranks and process groups (no processes started)"),
    "run": ("harness.cli.run", "run a workload and write a run directory"),
    "check": ("harness.cli.check", "run + postflight + parity against the stored golden"),
    "capture": ("harness.cli.capture", "run + postflight and write a golden for a platform that has none"),
    "refresh": ("harness.cli.refresh", "rewrite an existing golden (needs --reason)"),
    "diff": ("harness.cli.diff", "compare a run (or manifest) with a golden"),
    "validate": ("harness.cli.validate", "validate a manifest, a run directory or a golden directory"),
    "lint": ("harness.cli.lint", "check that scheduled workloads and stored goldens match"),
    "doctor": ("harness.cli.doctor", "check that configured plugins import in every worker environment"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="golden", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            p.set_defaults(_missing=True)
            continue
        module.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    if getattr(args, "_missing", False):
        print(f"golden {args.command}: not implemented yet", file=sys.stderr)
        return 2
    module = importlib.import_module(args._module)
    return int(module.run(args) or 0)
