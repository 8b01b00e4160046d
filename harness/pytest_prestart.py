"""The pytest plugin's warm-runtime start while pytest collects.

A golden session's first workload used to begin by starting Ray, the zygote (which
imports torch) and its first warm processes: about 4-6 s of wall time on the 2-core
box, after collection. When the session can only run golden tests (its ``-m``
expression selects tests marked ``golden`` and no unmarked test), :func:`start` begins
that start-up on a thread of its own before collection (``WarmRuntime.prestart``), and
the session's ``GoldenSession.warm_runtime`` takes the runtime over (:func:`take`),
waiting for the thread first. Once collection knows the selected workloads, the zygote
also starts the flavours of their policy backends (megatron, dtensor:
:func:`start_flavours`). Nothing a workload sees changes: it gets the same runtime,
pool processes and Ray instance it would have started itself.

Never prestarted: ``GOLDEN_PRESTART=0``, ``--collect-only``, ``GOLDEN_WARM=0`` (every workload cold),
``--golden-ray-address`` (cold on a cluster), the pytest-xdist controller (it runs no
test; each worker collects and prestarts its own), and any ``-m`` expression that may
select a test without the ``golden`` mark. A prestarted runtime that no golden test
takes is closed before the first test that does not use the ``golden`` fixture
(:func:`discard`, as the plugin closes the session's runtime there) and at the end of
the session. A failed prestart is dropped: the first workload starts the runtime
itself and reports any error as it always did.

Fail fast: nothing starts for a session whose verdicts are all decided from files
(:func:`would_run` is False for every workload: a spec that does not load or an unknown
workload, a missing or unusable golden without ``--golden-capture-missing``, a spec that
differs from the golden's, an unscheduled platform), nor for one whose ``-k`` leaves no
golden test that would run: with ``-k`` given the prestart waits for the end of collection
(:func:`start_flavours`), where the selected tests are known. Such sessions end in about
a second instead of paying Ray's start and shutdown (11-22 s on the 2-core box).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

log = logging.getLogger(__name__)

_KEY = "_golden_prestart"
_BEFORE_KEY = "_golden_before_run"  # {(workload, root): BeforeRun} of would_run, taken once by the session
PRESTART_ENV = "GOLDEN_PRESTART"  # "0": the first workload starts the runtime, as before


def wanted(config: pytest.Config) -> bool:
    """Whether this session should start the warm runtime while it collects."""
    if os.environ.get(PRESTART_ENV, "1").strip() == "0" or os.environ.get("GOLDEN_WARM", "1").strip() == "0":
        return False
    if config.getoption("collectonly", False) or config.getoption("--golden-ray-address", None):
        return False
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return False  # the xdist controller
    return golden_only(config.getoption("markexpr", "") or "")


def golden_only(markexpr: str) -> bool:
    """True when ``markexpr`` selects a test marked ``golden`` and no test without that mark,
    whatever other marks the tests carry: the expression is evaluated under every assignment
    of the other mark names it reads (found by evaluating it; more than eight: False)."""
    text = markexpr.strip()
    if not text:
        return False
    try:
        from _pytest.mark.expression import Expression  # pytest's own -m parser

        expr = Expression.compile(text)
    except Exception:  # noqa: BLE001 - not an expression this pytest accepts
        return False

    def evaluate(assignment: dict[str, bool], asked: set[str]) -> bool:
        def matcher(name: str, **_: object) -> bool:
            asked.add(name)
            return assignment.get(name, False)

        return bool(expr.evaluate(matcher))

    names: set[str] = {"golden"}
    while True:  # every mark name the expression reads (a short-circuit may hide some at first)
        known = set(names)
        if len(known) > 9:
            return False
        for bits in itertools.product((False, True), repeat=len(known)):
            evaluate(dict(zip(sorted(known), bits)), names)
        if names == known:
            break
    others = sorted(names - {"golden"})
    assignments = [dict(zip(others, bits)) for bits in itertools.product((False, True), repeat=len(others))]
    if any(evaluate({**a, "golden": False}, set()) for a in assignments):
        return False  # a test without the golden mark would be selected
    return any(evaluate({**a, "golden": True}, set()) for a in assignments)


class Prestart:
    """A warm runtime being started on a thread (:meth:`WarmRuntime.prestart`).

    The thread lives until the runtime is closed: the zygote dies with the thread that
    started it (``PR_SET_PDEATHSIG`` follows the creating thread, not the process), so a
    thread that ended after the start would take the zygote, and every worker still to be
    forked, with it."""

    def __init__(self, worker_logs: bool = False) -> None:
        from harness.runner.warm import WarmRuntime

        self.runtime = WarmRuntime(worker_logs=worker_logs)
        self.error: BaseException | None = None
        self.started = threading.Event()
        self.closed = threading.Event()
        self.runtime.on_close(self.closed.set)
        self.thread = threading.Thread(target=self._run, name="golden-prestart", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.runtime.prestart()
        except BaseException as exc:  # noqa: BLE001 - reported when taken; the session starts it again
            self.error = exc
        finally:
            self.started.set()
        self.closed.wait()  # the processes this thread started live as long as it does

    def start_flavours(self, names: list[str]) -> None:
        """On a thread of its own, once the runtime is up: start the zygote's flavours of these
        policy backends (``WarmRuntime.start_flavours``), so the first megatron or dtensor
        workload forks its fresh ranks from a flavour already importing its backend. A flavour
        process is the zygote's child, so this thread may end before the runtime does."""
        if not names:
            return

        def run() -> None:
            self.started.wait()
            if self.error is None:
                try:
                    self.runtime.start_flavours(names)
                except Exception as exc:  # noqa: BLE001 - the backend's first rank starts it instead
                    log.warning("golden: starting zygote flavours %s failed: %s", names, exc)

        threading.Thread(target=run, name="golden-flavours", daemon=True).start()

    def wait(self) -> Any:
        """The runtime, once it started; None (runtime closed) when the prestart failed."""
        self.started.wait()
        if self.error is not None:
            log.warning("golden: starting the warm runtime during collection failed (%s: %s); "
                        "the first workload starts it", type(self.error).__name__, self.error)
            self.runtime.close()
            return None
        return self.runtime


def would_run(config: pytest.Config, workload: str, root: Path) -> bool:
    """Whether ``GoldenSession`` would run ``workload`` (under ``root``) in this session: False
    when its verdict is decided from files alone (``harness.pytest_before_run.before_run``, the
    session's own pre-run checks). Reads specs and goldens only: no torch, no ray."""
    from harness.pytest_before_run import before_run

    # a spec that does not load or plan, or names a backend whose package is missing, is decided
    # there (its tests fail with the error, or are deselected) before anything starts
    before = before_run(str(workload), root, platform_opt=config.getoption("--golden-platform"),
                        refresh=bool(config.getoption("--golden-refresh")),
                        capture_missing=bool(config.getoption("--golden-capture-missing")),
                        allow_dirty=bool(config.getoption("--golden-allow-dirty")),
                        ray_address=config.getoption("--golden-ray-address", None),
                        options=config.getoption("--golden-option", None) or ())
    held = getattr(config, _BEFORE_KEY, None)
    if held is None:
        held = {}
        setattr(config, _BEFORE_KEY, held)
    held[(str(workload), str(root))] = before  # the session's run takes it: the spec is read once
    return before.decided is None


def worker_logs(config: pytest.Config) -> bool:
    """The run option ``worker_logs`` of ``--golden-option`` (the session's one Ray shows the
    workers' output); False for pairs that do not parse (each workload's plan refuses them, so
    its tests fail naming ``options.FIELD``)."""
    from harness.spec.errors import SpecError
    from harness.spec.runplan import parse_options

    try:
        return bool(parse_options(config.getoption("--golden-option", None) or ()).get("worker_logs", False))
    except SpecError:
        return False


def taken_before_run(config: pytest.Config, workload: str, root: Path) -> Any:
    """The ``BeforeRun`` (with its plan) :func:`would_run` decided for ``workload`` under ``root``
    in this session, handed over once (None when it asked none). ``GoldenSession`` takes it
    in a session that stores nothing (no refresh, no capture: the files it read do not change
    while the session runs) instead of reading and planning the spec again."""
    held = getattr(config, _BEFORE_KEY, None) or {}
    return held.pop((str(workload), str(root)), None)


def _planned_backend(config: pytest.Config, name: str, root: Path) -> str | None:
    """The policy backend of a workload :func:`would_run` planned (its ``BeforeRun``, not taken),
    else None."""
    held = getattr(config, _BEFORE_KEY, None) or {}
    before = held.get((str(name), str(root)))
    run_plan = getattr(before, "plan", None)
    return run_plan.workload.policy.backend if run_plan is not None else None


def _selected(config: pytest.Config, items: list) -> tuple[list[tuple[str, Path]], bool]:
    """The distinct (workload, root) of the selected tests using the ``golden`` fixture whose
    workload (a ``golden_params`` parameter) :func:`would_run`; and whether a selected test uses
    the fixture without such a parameter (what it runs is unknown here: it may need the runtime)."""
    out: list[tuple[str, Path]] = []
    unknown = False
    for item in items:
        if "golden" not in getattr(item, "fixturenames", ()):
            continue
        workload = getattr(getattr(item, "callspec", None), "params", {}).get("workload")
        root = getattr(workload, "root", None)
        if workload is None or root is None:
            unknown = True
            continue
        if getattr(workload, "problem", None) or (str(workload), root) in out:
            continue
        if would_run(config, str(workload), root):
            out.append((str(workload), root))
    return out, unknown


def start(config: pytest.Config, candidates: list[tuple[str, Path]]) -> None:
    """Before collection: begin the prestart when :func:`wanted`, no ``-k`` is given (its
    selection is known only after collection) and one of ``candidates`` (the workloads the
    session's goldens root schedules) :func:`would_run`."""
    if getattr(config, _KEY, None) is not None or not wanted(config) or (config.getoption("keyword") or "").strip():
        return
    if any(would_run(config, name, root) for name, root in candidates):
        setattr(config, _KEY, Prestart(worker_logs(config)))


def start_flavours(config: pytest.Config, items: list) -> None:
    """After collection: close a prestart that no selected golden test would use (every verdict
    decided from files); start one (``-k`` given) when a selected workload :func:`would_run`;
    then start the zygote flavours of the policy backends those workloads use."""
    selected, unknown = _selected(config, items)
    prestart = getattr(config, _KEY, None)
    if prestart is not None and not (selected or unknown):
        discard(config)
        return
    if prestart is None and (selected or unknown) and wanted(config):
        prestart = Prestart(worker_logs(config))
        setattr(config, _KEY, prestart)
    if prestart is None:
        return
    from harness.runner.zygote import FLAVOURS

    backends: list[str] = []
    for name, root in selected:
        backend = _planned_backend(config, name, root)  # would_run planned every selected workload
        if backend is None:  # a spec that does not load fails its own tests
            continue
        if backend in FLAVOURS and backend not in backends:
            backends.append(backend)
    prestart.start_flavours(backends)


def take(config: pytest.Config) -> Any:
    """The prestarted runtime (waited for), handed over once; None when there is none."""
    prestart = getattr(config, _KEY, None)
    if prestart is None:
        return None
    setattr(config, _KEY, None)
    return prestart.wait()


def discard(config: pytest.Config) -> None:
    """Close a prestarted runtime no golden test took (a test without the fixture is next)."""
    runtime = take(config)
    if runtime is not None:
        runtime.close()
