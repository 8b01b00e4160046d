"""golden: run GRPO golden workloads, postflight them and gate their surfaces.

Each subcommand lives in its own module ``harness.cli.<name>`` exposing
``HELP: str``, ``add_arguments(parser)`` and ``run(args) -> int``. Modules are
imported only when their subcommand runs, so ``golden plan`` / ``validate`` /
``diff`` never pay for (or need) the workload half.

Exit codes (every subcommand; docs/gate.md has the table):

* 0 success / parity;
* 1 a verdict that fails: findings (regression or probable stale golden),
  invalid files (validate), lint findings, a plugin that does not import;
* 2 usage error or unusable input: bad flags, unknown workload, invalid spec,
  missing or corrupt golden, unusable run directory or report path; always
  reported before a workload starts;
* 3 no verdict: the run did not complete (a crash in the stack under test or
  in the infrastructure), or an internal error of the harness;
* 130 interrupted by Ctrl-C (SIGINT), 143 by SIGTERM, at any point: nothing was compared or stored.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
import traceback

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_NO_VERDICT = 3
EXIT_INTERRUPTED = 130

# name -> (module, one-line help). Order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("harness.cli.list_cmd", "list golden workloads and their platforms"),
    "plan": ("harness.cli.plan", "lay out a workload's ranks and process groups (no processes started)"),
    "run": ("harness.cli.run", "run a workload and write a run directory"),
    "check": ("harness.cli.check", "run + postflight + parity against the stored golden"),
    "capture": ("harness.cli.capture", "run + postflight and write a golden for a platform that has none"),
    "refresh": ("harness.cli.refresh", "rewrite an existing golden (needs --reason)"),
    "diff": ("harness.cli.diff", "compare a run (or manifest) with a golden"),
    "locate": ("harness.cli.locate", "name the aten op (and file:line) inside the first diverging module of a run"),
    "validate": ("harness.cli.validate", "validate a manifest, a run directory or a golden directory"),
    "lint": ("harness.cli.lint", "check that scheduled workloads and stored goldens match"),
    "affected": ("harness.cli.affected_cmd", "list the golden workloads a change since BASE can affect"),
    "lock": ("harness.cli.lock_cmd", "record unlocked goldens in the root's GOLDENS.lock (never re-blesses)"),
    "doctor": ("harness.cli.doctor", "check that configured plugins import in every worker environment"),
    "env": ("harness.cli.env_cmd", "build, list and locate the per-backend worker environments"),
}


class GoldenParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors suggest the closest spelling.

    A misspelled option (``--goldens-rot``) or command (``chek``) gets
    ``did you mean ...?`` after argparse's message; the usage printed is the
    parser's own, so a subcommand's error shows that subcommand's usage."""

    def error(self, message: str):  # type: ignore[override]
        super().error(message + suggestion(self, message))


def suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """`` (did you mean X?)`` for an unrecognized option or an invalid choice, else ``""``."""
    picks = []
    match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if match:
        choices = re.findall(r"'([^']*)'", match.group(2))
        picks = difflib.get_close_matches(match.group(1), choices, n=1, cutoff=0.5)
    elif message.startswith("unrecognized arguments: "):
        known = [s for action in parser._actions if action.help != argparse.SUPPRESS
                 for s in action.option_strings]
        for token in message.split(": ", 1)[1].split():
            if token.startswith("-"):
                picks += [f"{token.split('=')[0]} -> {m}"
                          for m in difflib.get_close_matches(token.split("=")[0], known, n=1, cutoff=0.6)]
        if len(picks) == 1:
            picks = [picks[0].split(" -> ")[1]]
    return f" (did you mean {', '.join(picks)}?)" if picks else ""


def build_parser() -> argparse.ArgumentParser:
    from harness import __version__

    parser = GoldenParser(
        prog="golden", description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        epilog="exit codes: 0 parity/success, 1 findings (regression or stale golden), 2 usage error or unusable "
               "input\n(checked before any run), 3 no verdict (run incomplete or internal error), 130 interrupted")
    parser.add_argument("--version", action="version", version=f"golden {__version__}",
                        help="print the harness version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers = {}
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        subparsers[name] = p
        p.set_defaults(_module=module_name)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            p.set_defaults(_missing=True)
            continue
        module.add_arguments(p)
    parser.set_defaults(_subparsers=subparsers)
    return parser


def _printable_streams() -> None:
    """stdout/stderr escape what their encoding cannot write (a file name holding non-UTF-8
    bytes, any non-ASCII path under an ASCII locale) instead of raising UnicodeEncodeError
    halfway through a report: the message still names the file, as ``\udcff`` / ``\xe9``."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a closed or detached stream: leave it as it is
                pass


def _reader_went_away() -> int:
    """stdout's reader closed the pipe (``golden list | head``): stop quietly, as a Unix tool
    does, with no traceback; stdout goes to /dev/null so the exit flush cannot raise again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the closed pipe


def main(argv: list[str] | None = None) -> int:
    """Run one ``golden`` command; its exit code (module docstring). A reader that closes stdout
    early (``golden list | head``) ends it quietly, whatever the command (exit 141)."""
    from harness import interrupts

    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except BrokenPipeError:
        return _reader_went_away()
    except KeyboardInterrupt:  # one that came outside the command's own handler (while it was put back)
        return interrupts.exit_code()


def _main(argv: list[str] | None = None) -> int:
    _printable_streams()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse stops filling a positional list at the first option, so `run W --platform cuda a.b=1`
    # leaves `a.b=1` over: overrides may come anywhere after the workload.
    if extra and isinstance(getattr(args, "overrides", None), list) and all(
            "=" in token and not token.startswith("-") for token in extra):
        args.overrides.extend(extra)
    elif extra:  # the subcommand's usage, not the top-level one
        owner = args._subparsers.get(getattr(args, "command", None) or "", parser)
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    if getattr(args, "_missing", False):
        print(f"golden {args.command}: not implemented yet", file=sys.stderr)
        return 2
    from harness import interrupts

    interrupts.reset()
    previous = interrupts.install()  # SIGTERM at any point ends the command like Ctrl-C (issue 41)
    try:
        module = importlib.import_module(args._module)
        code = int(module.run(args) or 0)
        if interrupts.last() is not None and code != interrupts.exit_code():  # the signal came as the command ended
            raise KeyboardInterrupt
        return code
    except BrokenPipeError:
        raise  # main() ends it quietly
    except KeyboardInterrupt:
        print(f"golden {args.command}: interrupted", file=sys.stderr)
        return interrupts.exit_code()
    except Exception as exc:  # noqa: BLE001 - a bug or an infrastructure failure: no verdict
        traceback.print_exc()
        print(f"golden {args.command}: internal error ({type(exc).__name__}: {exc}); no verdict "
              f"(exit {EXIT_NO_VERDICT})", file=sys.stderr)
        return EXIT_NO_VERDICT
    finally:
        interrupts.restore(previous)
