"""``golden locate RUN [GOLDEN]``: name the aten op inside the first diverging module.

RUN is a finished run directory whose numerics surface differs from GOLDEN (a golden folder or
a workload name, resolved as ``golden diff`` resolves it). The first numerics finding in
execution order (``harness.parity.locate.first_module``: module, rank, step, microbatch,
phase) picks the module call; the run's step is then replayed twice with op-level hashing
inside that call on that rank (``harness.locate``): once in this tree (the run's code), once
in a temporary worktree of the golden's commit (its PROVENANCE), each with the spec it ran.
The first op of the run's replay whose tensor inputs are values the golden's replay computed
and whose output it never computed is named, with its Python stack (file:line of the model
code). A forward finding watches the module's forward; a gradient finding watches the
backward of the modules that consumed that output (the culprit the finding names); a
parameter as initialised watches the construction of the policy model on that rank.

Refused (exit 2, saying why) before anything runs: RUN not a complete run directory, no
numerics surface in the run or the golden, no numerics divergence, a first finding that is a
parameter after an optimizer step (the optimizer is not watched), the run made by another harness than this tree's (its
``run.json`` code digest), the golden captured from a dirty tree or from a commit the
repository (``--repo``, default: the one holding this tree) does not have. Exit 1 when an op
is named (the run diverges, as ``golden diff`` says), 3 when the replays name none (a replay
that fails or does not reproduce the run's digests: no verdict). docs/locator.md has the
contract and its limits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP = "name the aten op (and file:line) inside the first diverging module of a run"


class Refusal(Exception):
    """Exit 2: unusable input, the message names it (3: a run that did not complete, as ``golden diff``)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_path", metavar="RUN", help="a finished run directory (its run.json and manifest)")
    parser.add_argument("golden", metavar="GOLDEN", nargs="?", default=None,
                        help="golden directory or workload name (default: the run's workload)")
    parser.add_argument("--platform", default=None, help="platform of the golden when GOLDEN is a workload name")
    from harness.cli._options import add_goldens_root

    add_goldens_root(parser, type=Path)
    parser.add_argument("--format", choices=("terminal", "json"), default="terminal", help="report format")
    parser.add_argument("--repo", type=Path, default=None,
                        help="git repository holding the golden's commit (default: the one holding this tree)")
    parser.add_argument("--timeout", type=float, default=900.0, metavar="S", help="limit of each replay (seconds)")
    parser.add_argument("--keep", action="store_true", help="keep the replays' folder (printed on stderr)")


def _first_finding(golden_doc: dict, actual_doc: dict):
    from harness.parity.comparison import compare_surface
    from harness.parity.locate import first_module, split_entry

    result = compare_surface("numerics", golden_doc, actual_doc)
    located = first_module(result.findings, golden_doc, actual_doc)
    if located is None:
        failing = [f for f in result.findings if f.status in ("fail", "stale")]
        if failing:
            f = failing[0]
            raise Refusal(f"the numerics surfaces differ but no module entry does (first: {f.section} "
                          f"{'/'.join(map(str, f.path))}: {f.note or f.status}); nothing to locate")
        raise Refusal("the run's numerics surface equals the golden's: no divergence to locate")
    finding, annotated = located
    key = str(finding.path[1])
    step, phase, mb, module, call = split_entry(key)  # type: ignore[misc]
    return finding, annotated, key, step, phase, mb, module, call


def _targets(body: dict, step: int, phase: str, mb: int, module: str, call: int) -> list[dict]:
    """The module calls to watch: the finding's own call in forward; for a gradient, the calls of
    the same step and microbatch whose forward took that module's output (its consumers)."""
    if phase in ("forward", "param"):
        return [{"module": module, "call": call}]
    prefix = f"step{step:04d}/forward/mb{mb:03d}/"
    out = []
    for k, rec in sorted((body.get("entries") or {}).items()):
        if k.startswith(prefix) and module in (rec.get("inputs") or ()):
            name, _, n = k[len(prefix):].partition("#")
            out.append({"module": name, "call": int(n.split(".", 1)[0])})
    return out


def _check_reproduced(replay, doc: dict, section: str) -> str | None:
    """None when each watched call's output digest equals the surface's entry, else why not."""
    entries = ((doc.get("sections") or {}).get(section) or {}).get("entries") or {}
    seen = replay.targets()
    if not seen:
        return f"the {replay.label} replay never reached the watched call (exit {replay.returncode})"
    for t in seen:
        if t.get("entry") is None:   # the model's construction: no entry of its own
            continue
        want = (entries.get(t["entry"]) or {}).get("sha256")
        if want is not None and t.get("sha256") != want:
            return (f"the {replay.label} replay did not reproduce {t['entry']} (sha256 {str(t.get('sha256'))[:12]} "
                    f"vs {want[:12]} recorded)")
    return None


def _render(doc: dict) -> str:
    lines = [f"golden locate {doc['workload']}: {doc['finding']}"]
    op = doc.get("op")
    if op is None:
        lines.append(f"no op named: {doc['reason']}")
        return "\n".join(lines) + "\n"
    lines.append(f"first diverging op: {op['op']} ({op['phase']}, in {op['target']}, op #{op['i']})")
    lines.append(f"  at {op['where']}")
    lines.append("  inputs match the golden's; its output differs")
    if op.get("args"):
        lines.append(f"  non-tensor arguments: {', '.join(op['args'])}")
    if doc.get("counterpart"):
        c = doc["counterpart"]
        lines.append(f"  the golden's {c['op']} on the same inputs: non-tensor arguments {', '.join(c['args']) or '-'}")
    for d in doc.get("derived") or ():
        lines.append(f"  an input made by {d['op']} at {d['where']} (a move or cast of matching values)")
    lines.append("  stack (innermost last):")
    lines.extend(f"    {s}" for s in op["stack"])
    if op.get("forward_stack"):
        lines.append(f"  autograd node {op.get('node')}, made in forward at:")
        lines.extend(f"    {s}" for s in op["forward_stack"])
    for t in doc.get("then") or ():
        lines.append(f"  then: {t['op']} at {t['where']}")
    lines.append(f"ops watched: run {doc['ops']['run']}, golden {doc['ops']['golden']} "
                 f"(golden commit {doc['golden_commit'][:12]})")
    return "\n".join(lines) + "\n"


def _op_doc(r: dict) -> dict:
    from harness.locate.ops import where

    keep = ("op", "phase", "target", "i", "args", "in", "out", "stack", "node", "forward_stack")
    return {**{k: r[k] for k in keep if k in r}, "where": where(r)}


def _prepare(args: argparse.Namespace):
    from harness import code_identity
    from harness.cli.diff import UnusableInput, _golden, load_run_surfaces
    from harness.postflight.read import RunRefused

    run_path = Path(args.run_path)
    if not (run_path.is_dir() and (run_path / "run.json").is_file()):
        raise Refusal(f"RUN {args.run_path}: not a run directory (no run.json); give the folder `golden run` wrote")
    try:
        documents = load_run_surfaces(run_path)
    except RunRefused as exc:
        raise Refusal(f"RUN {args.run_path}: {exc}", exc.code) from None
    run = documents.run or {}
    actual = documents.surfaces.get("numerics")
    if actual is None:
        raise Refusal(f"RUN {args.run_path}: the run has no numerics surface (recorded before it existed, or "
                      "a backend without taps): nothing to locate")
    if args.golden is None:
        args.golden = (documents.manifest.get("workload") or {}).get("name") or run.get("workload")
    try:
        golden = _golden(args, documents)
    except UnusableInput as exc:
        raise Refusal(f"GOLDEN {args.golden}: {exc}") from None
    golden_doc = golden.surfaces.get("numerics")
    if golden_doc is None:
        raise Refusal(f"GOLDEN {golden.path}: the golden has no numerics surface (refresh it to record one)")
    ours = code_identity.digest()
    theirs = (run.get("code") or {}).get("digest")
    if theirs != ours:
        raise Refusal(f"RUN {args.run_path}: the run was made by another harness than this tree's (run.json "
                      f"code.digest {str(theirs)[:12]} at {(run.get('code') or {}).get('root')}, this tree "
                      f"{ours[:12]} at {code_identity.package_root()}): run golden locate from the tree that made it")
    return documents, run, actual, golden, golden_doc


def run(args: argparse.Namespace) -> int:
    from harness import code_identity
    from harness.locate import ops as opsmod
    from harness.locate import replay as rp

    try:
        _, run_doc, actual, golden, golden_doc = _prepare(args)
        finding, annotated, key, step, phase, mb, module, call = _first_finding(golden_doc, actual)
        section = finding.section or ""
        body = ((golden_doc.get("sections") or {}).get(section) or {})
        mine = (actual.get("sections") or {}).get(section) or {}
        if body.get("recorded") is False or mine.get("recorded") is False:
            raise Refusal(f"{section}: the numerics of this rank are not recorded on one side; nothing to replay")
        if phase == "param" and step > 0:
            raise Refusal(f"the first finding is a parameter after the optimizer step of step {step} ({module}, "
                          f"{section}) while every gradient of the step matches: the optimizer is not watched "
                          "(docs/locator.md, limits)")
        targets = _targets(body, step, phase, mb, module, call)
        if not targets:
            raise Refusal(f"the gradient at the output of {module} ({key}, {section}) has no tapped consumer: "
                          "the code whose backward made it is untapped")
        prov = golden.provenance or {}
        repo_info = prov.get("repository") or {}
        commit = repo_info.get("commit") or prov.get("commit")
        if not commit:
            raise Refusal(f"GOLDEN {golden.path}: its PROVENANCE.json records no commit")
        if repo_info.get("dirty") or repo_info.get("uncommitted"):
            raise Refusal(f"GOLDEN {golden.path}: captured from a dirty tree at {commit[:12]}: that commit does not "
                          "hold the golden's code, so it cannot be replayed")
        tree = code_identity.package_root().parent
        repo = args.repo or rp.repository_of(tree)
        if repo is None:
            raise Refusal(f"this tree ({tree}) is in no git repository: give --repo, the clone holding the golden's "
                          f"commit {commit[:12]}")
        if not rp.has_commit(repo, commit):
            raise Refusal(f"the golden's commit {commit} is not in the repository {repo}")
        if run_doc.get("git_commit") and not rp.has_commit(repo, run_doc["git_commit"]):
            raise Refusal(f"RUN {args.run_path}: its commit {run_doc['git_commit']} is not in the repository {repo}: "
                          "the run is not from this repository")
        spec_run, spec_golden = run_doc.get("spec"), prov.get("spec")
        if not isinstance(spec_run, dict) or not isinstance(spec_golden, dict):
            raise Refusal("the run's run.json or the golden's PROVENANCE.json holds no spec to replay")
    except Refusal as exc:
        print(f"golden locate: {'no verdict' if exc.code == 3 else 'unusable input'}: {exc}", file=sys.stderr)
        return exc.code
    platform = (run_doc.get("plan_options") or {}).get("platform") or golden.platform
    coords = dict(body.get("coords") or {})
    # a parameter as initialised: the model's construction on that rank is watched (phase init)
    plan = {"step": step, "microbatch": mb, "phase": "init" if phase == "param" else phase, "coords": coords,
            "targets": targets}
    base = rp.scratch()

    def say(message: str) -> None:
        print(f"golden locate: {message}", file=sys.stderr, flush=True)

    try:
        say(f"{annotated.note}")
        watched = ("the policy model's construction" if phase == "param" else
                   ", ".join(f"{t['module']}#{t['call']}" for t in targets) + f" ({phase})")
        say(f"replaying step {step} in this tree, watching {watched} on {section}")
        cur = rp.run_replay("run", tree, spec_run, platform, plan, base, timeout=args.timeout)
        say(f"replaying step {step} at the golden's commit {commit[:12]}")
        try:
            with rp.golden_tree(Path(repo), commit, base) as gtree:
                gold = rp.run_replay("golden", gtree, spec_golden, platform, plan, base, timeout=args.timeout)
        except rp.ReplayRefused as exc:
            print(f"golden locate: unusable input: {exc}", file=sys.stderr)
            return 2
    finally:
        if args.keep:
            print(f"golden locate: replays kept in {base}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(base, ignore_errors=True)
    doc = {"workload": golden.workload, "platform": golden.platform, "finding": annotated.note, "entry": key,
           "section": section, "coords": coords, "step": step, "microbatch": mb, "phase": phase,
           "targets": targets, "golden_commit": commit, "ops": {"run": len(cur.ops()), "golden": len(gold.ops())},
           "op": None}
    reason = (_check_reproduced(cur, actual, section) or _check_reproduced(gold, golden_doc, section))
    located = None if reason else opsmod.first_op(gold.ops(), cur.ops())
    if reason is None and located is None:
        reason = "every op the run's replay made inside the watched calls computed values the golden's replay holds"
    if reason is not None:
        tails = "\n".join(f"[{r.label} replay exit {r.returncode}] {r.tail[-1500:]}" for r in (cur, gold)
                          if r.returncode != 0)
        doc["reason"] = reason
        out = json.dumps(doc, indent=2, sort_keys=True) + "\n" if args.format == "json" else _render(doc)
        sys.stdout.write(out)
        if tails:
            print(tails, file=sys.stderr)
        return 3
    doc["op"] = _op_doc(located.op)
    doc["counterpart"] = _op_doc(located.counterpart) if located.counterpart else None
    doc["derived"] = [_op_doc(d) for d in located.derived]
    doc["then"] = [_op_doc(t) for t in located.then]
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n" if args.format == "json" else _render(doc))
    return 1
