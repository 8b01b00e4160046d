"""``pytest --golden-since=BASE``: run only the golden tests a change since BASE can affect.

Contract (gate half: no torch, no ray):

* ``selections(config, base, root, platform)`` computes ``harness.footprint.affected`` once
  per session (also for the prestart, so a session with nothing affected starts no Ray);
  an ``AffectedError`` (BASE does not resolve, not a git work tree) is a ``pytest.UsageError``
  naming it.
* ``deselect_unaffected`` deselects (``pytest_deselected``) every ``golden_params`` test whose
  workload is not affected, and every ``golden``-marked test with a ``golden_uses`` marker none
  of whose workloads is affected and none of whose ``files`` changed. Every other test stays:
  a golden test that says nothing about what it runs always runs.
* ``summary`` prints a ``golden --golden-since BASE`` section: each affected workload with
  the first changed file that made it, then each workload left out as ``not affected (not run,
  not passed)``. Nothing left out is ever counted as passed.
* ``nothing_affected`` is True when the selection left no test at all: the session then exits
  0 instead of pytest's 5 ("no tests collected"), with the summary saying that nothing ran.
"""

from __future__ import annotations

from pathlib import Path

import pytest

__all__ = ["deselect_unaffected", "nothing_affected", "selections", "summary"]

_KEY = "_golden_since"


def selections(config: pytest.Config, base: str, root: Path, platform: str | None) -> dict:
    """``{"base", "by_workload": {name: Selection}, "changed": [paths]}``, computed once."""
    state = getattr(config, _KEY, None)
    if state is not None:
        return state
    import os

    from harness.footprint.affected import AffectedError, affected, changed_paths, work_tree

    try:
        chosen = affected(base, root, platform or os.environ.get("GOLDEN_PLATFORM"))
        changed = [c.path for c in changed_paths(work_tree(root), base)]
    except AffectedError as exc:
        raise pytest.UsageError(f"--golden-since {base}: {exc}") from None
    state = {"base": base, "by_workload": {s.workload: s for s in chosen}, "changed": changed,
             "deselected": [], "left": None}
    setattr(config, _KEY, state)
    return state


def affected_names(config: pytest.Config, root: Path, names: list[str]) -> list[str]:
    """``names`` without the workloads ``--golden-since`` leaves out (all of them without the option)."""
    base = config.getoption("--golden-since")
    if not base:
        return names
    by = selections(config, base, root, config.getoption("--golden-platform"))["by_workload"]
    return [n for n in names if n in by and by[n].selected]  # not in it: not scheduled on the platform


def deselect_unaffected(config: pytest.Config, items: list, base: str, root: Path, platform: str | None) -> None:
    state = selections(config, base, root, platform)
    by = state["by_workload"]
    changed = set(state["changed"])
    keep, drop, uses_dropped = [], [], 0
    for item in items:
        if item.get_closest_marker("golden") is None:
            keep.append(item)
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        workload = params.get("workload")
        uses = item.get_closest_marker("golden_uses")
        if workload is not None and getattr(workload, "problem", None) is None and str(workload) in by:
            (keep if by[str(workload)].selected else drop).append(item)
        elif uses is not None:
            named = [str(w) for w in uses.args]
            files = set(uses.kwargs.get("files", ()))
            hit = any(w not in by or by[w].selected for w in named) or bool(files & changed)
            (keep if hit else drop).append(item)
            uses_dropped += not hit
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    state["deselected"] = sorted({item.nodeid for item in drop})
    state["left"] = len(keep)
    state["uses_deselected"] = uses_dropped


def nothing_affected(config: pytest.Config) -> bool:
    state = getattr(config, _KEY, None)
    return bool(state) and state["left"] == 0 and not hasattr(config, "workerinput")


def summary(tr, config: pytest.Config, root: Path | None = None) -> None:
    """The ``--golden-since`` section. On a pytest-xdist controller (which collects nothing) the
    selection is computed again from ``root``; the workers deselected the tests."""
    state = getattr(config, _KEY, None)
    base = config.getoption("--golden-since")
    if not state and base and root is not None:
        state = selections(config, base, root, config.getoption("--golden-platform"))
    if not state:
        return
    if state["left"] is None:
        state["left"] = -1  # this process deselected nothing (an xdist controller): its workers did
    by = state["by_workload"]
    chosen = [s for s in by.values() if s.selected]
    tr.section(f"golden --golden-since {state['base']}")
    for s in sorted(chosen, key=lambda s: s.workload):
        tr.write_line(f"{s.workload:<36} affected: {s.reason}")
    for s in sorted((s for s in by.values() if not s.selected), key=lambda s: s.workload):
        tr.write_line(f"{s.workload:<36} not affected (not run, not passed)", yellow=True)
    others = state.get("uses_deselected", 0)
    line = f"{len(chosen)} of {len(by)} workload(s) affected since {state['base']}; "
    if state["left"] == -1:
        line += "the xdist workers deselected the tests of the others"
    else:
        line += (f"{len(state['deselected'])} test(s) deselected as not affected"
                 + (f" (of them {others} golden_uses test(s))" if others > 0 else "")
                 + ("; NOTHING WAS RUN: no golden verdict in this session" if not state["left"] else ""))
    tr.write_line(line, yellow=not state["left"], bold=True)
