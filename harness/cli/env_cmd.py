"""``golden env build|list|path``: the per-backend worker environments (docs/worker-envs.md).

* ``golden env build [BACKEND ...]`` builds each (default: all) into the cache, or
  verifies and reuses one that is current: prints ``built`` / ``reused`` and the seconds;
* ``golden env list``: every declared environment, its status and path;
* ``golden env path BACKEND``: the environment's interpreter (exit 2 unless it is ok).

Exit 0 on success, 1 when a build fails (the log is named), 2 for an unknown
backend or an unusable environment (``path``). ``--cache-dir`` (env
``GOLDEN_ENV_CACHE``) picks the cache.
"""

from __future__ import annotations

import argparse
import sys

HELP = "build, list and locate the per-backend worker environments"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="env_command", metavar="build|list|path", required=True)
    build = sub.add_parser("build", help="build (or verify and reuse) worker environments")
    build.add_argument("backends", nargs="*", metavar="BACKEND",
                       help="native, megatron, dtensor, vllm (default: all)")
    build.add_argument("--overlay", action="store_true",
                       help="a venv layered on this interpreter's packages (installs nothing; tests, development)")
    listing = sub.add_parser("list", help="every declared environment, its status and path")
    path = sub.add_parser("path", help="print an environment's interpreter")
    path.add_argument("backend", metavar="BACKEND")
    for p in (build, listing, path):
        p.add_argument("--cache-dir", default=None, metavar="DIR",
                       help="worker-environment cache (default: $GOLDEN_ENV_CACHE, else "
                            "~/.cache/grpo-golden-harness/worker-envs)")


def run(args: argparse.Namespace) -> int:
    from harness.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
    from harness.workerenv import declare, stamp

    try:
        cache = stamp.cache_dir(args.cache_dir)
        if args.env_command == "list":
            return _list(cache)
        if args.env_command == "path":
            state = stamp.inspect(cache, args.backend)
            if state.status != "ok":
                print(f"golden env path: {state.refusal()}", file=sys.stderr)
                return EXIT_USAGE
            print(state.python)
            return EXIT_OK
        backends = list(args.backends) or list(declare.ENVIRONMENTS)
        for backend in backends:
            declare.declaration(backend)  # every name checked before anything is built
        return EXIT_OK if _build(cache, backends, overlay=args.overlay) else EXIT_FINDINGS
    except declare.WorkerEnvError as exc:
        print(f"golden env {args.env_command}: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _say(msg: str) -> None:
    print(f"[golden env] {msg}", file=sys.stderr, flush=True)


def _build(cache, backends: list[str], *, overlay: bool) -> bool:
    from harness.workerenv.build import BuildFailed, build

    ok = True
    for backend in backends:
        try:
            result = build(backend, cache, overlay=overlay, say=_say)
        except BuildFailed as exc:
            print(f"{backend}: build FAILED: {exc}")
            ok = False
            continue
        why = f" ({result.reason})" if result.reason else ""
        print(f"{backend}: {result.action} in {result.seconds:.1f}s{why}: {result.path}")
    return ok


def _list(cache) -> int:
    from harness.cli import EXIT_OK
    from harness.workerenv import declare, stamp

    print(f"cache: {cache}")
    for backend, decl in declare.ENVIRONMENTS.items():
        state = stamp.inspect(cache, backend)
        extra = ""
        if state.stamp is not None:
            st = state.stamp
            extra = f", {st.get('kind')}, built in {st.get('build_s')}s at {st.get('built_at')}"
        why = f" ({state.reason})" if state.reason else ""
        print(f"{backend:9s} {state.status}{why}{extra}: {state.path}  [{decl.note}; for {', '.join(decl.roles)}]")
    return EXIT_OK
