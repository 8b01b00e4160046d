"""``golden run WORKLOAD [key=value ...]``: run a workload and postflight it."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cli._workload_args import add_workload_arguments

    add_workload_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from harness.cli._workload_args import execute_or_explain

    execution, code = execute_or_explain(args)
    if execution is None:
        return code
    print(execution.run_dir)
    return 0 if execution.ok else 1
