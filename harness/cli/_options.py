"""Options spelled the same in every subcommand, and the report-format rule of ``--output``.

Light on purpose (argparse, pathlib): the parser imports it for ``--help``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

FORMATS = ("terminal", "markdown", "json", "junit", "html")

# The report format an --output suffix implies.
SUFFIX_FORMATS = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown",
                  ".xml": "junit", ".json": "json"}

GOLDENS_ROOT_HELP = ("goldens folder: workload specs and their goldens (default: $GOLDEN_ROOT, "
                     "else the default goldens/ folder)")


def add_goldens_root(parser: argparse.ArgumentParser, *, dest: str = "goldens_root", type=None) -> None:
    """``--goldens-root DIR`` (env ``GOLDEN_ROOT``), the one spelling of every subcommand and of
    the pytest plugin. ``--goldens``, an older spelling of the workload commands, is still read
    but not shown."""
    kwargs = {"type": type} if type is not None else {}
    parser.add_argument("--goldens-root", dest=dest, default=None, metavar="DIR", help=GOLDENS_ROOT_HELP, **kwargs)
    parser.add_argument("--goldens", dest=dest, default=None, help=argparse.SUPPRESS, **kwargs)


def add_report_arguments(parser: argparse.ArgumentParser, *, output_type=None) -> None:
    """``--format`` and ``--output`` of the commands that render a verdict (check, diff)."""
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="report format (default: from the --output suffix .html .md .xml(junit) .json, "
                             "else terminal)")
    kwargs = {"type": output_type} if output_type is not None else {}
    parser.add_argument("--output", default=None, metavar="FILE",
                        help="write the report here instead of stdout (stdout then gets one summary line)", **kwargs)


def report_format(fmt: str | None, output: str | Path | None) -> str:
    """The format to render: ``--format``, else the one the ``--output`` suffix implies, else terminal.

    Raises ValueError when both are given and disagree (``--output r.html --format markdown``)."""
    implied = SUFFIX_FORMATS.get(Path(output).suffix.lower()) if output else None
    if fmt and implied and fmt != implied:
        raise ValueError(f"--output {output}: the suffix {Path(output).suffix} means --format {implied}, "
                         f"but --format {fmt} was given; drop --format or rename the file")
    return fmt or implied or "terminal"
