"""The pytest plugin's per-process golden runner (:class:`GoldenSession`) and the hints
its failures print.

``GoldenSession`` runs each selected workload once per process (warm, see
docs/runner.md), answers every ``test_golden[workload-surface]`` from that one run,
and decides per workload: compared, refreshed (``--golden-refresh``: a compare-and-swap
on the golden seen before the run), created (``--golden-capture-missing``), missing,
incomplete or error. A surface test fails unless its workload was compared and that
surface is at parity. The hooks and options live in ``harness.pytest_plugin``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.pytest_before_run import before_run


class GoldenSession:
    """Runs each workload once and answers per-surface checks from the cache."""

    def __init__(self, config: pytest.Config, tmp_root: Path, session_root: Callable[[], Path]) -> None:
        self.config = config
        self.tmp_root = tmp_root
        self.session_root = session_root  # this session's goldens root (the plugin's options)
        self.root_opt = config.getoption("--goldens-root")
        self.platform_opt = config.getoption("--golden-platform")
        self.ray_address = config.getoption("--golden-ray-address", None)
        self.refresh = bool(config.getoption("--golden-refresh"))
        self.capture_missing = bool(config.getoption("--golden-capture-missing"))
        self.reason = config.getoption("--golden-reason")
        self.allow_dirty = bool(config.getoption("--golden-allow-dirty"))
        self.run_options = tuple(config.getoption("--golden-option", None) or ())  # FIELD=VALUE run switches
        self._cache: dict[tuple[str, str], tuple] = {}
        self._compared: dict[tuple[str, str], str | None] = {}  # the stored golden each run was compared with
        self.stored_by_current_test: str | None = None
        self._refresh_changes: str | None = None  # what the last refresh changed (the summary shows it)
        self._progress_stream = None
        self._warm = None  # harness.runner.warm.WarmRuntime, created on the first workload

    def warm_runtime(self):
        """This process's warm runtime (one Ray instance + warm worker processes shared by its
        workloads, docs/runner.md); None with ``GOLDEN_WARM=0`` (every workload cold)."""
        if os.environ.get("GOLDEN_WARM", "1").strip() == "0":
            return None
        if self._warm is None:
            from harness import pytest_prestart

            self._warm = pytest_prestart.take(self.config)  # started while pytest collected, if it was
        if self._warm is None:
            from harness.pytest_prestart import worker_logs
            from harness.runner.warm import WarmRuntime  # ray is imported only when it starts

            self._warm = WarmRuntime(worker_logs=worker_logs(self.config))
        return self._warm

    def close_warm(self) -> None:
        if self._warm is not None:
            self._warm.close()

    def root_of(self, workload: str) -> Path:
        """The goldens root ``golden_params`` found ``workload`` under, else this session's root."""
        root = getattr(workload, "root", None)
        if root is None:
            root = self.session_root()
        return root

    def _evaluate(self, workload: str) -> tuple:
        """``(outcome, message, execution, verdict)``, computed once per workload:
        every outcome is cached, so a workload never runs twice in one process."""
        root = self.root_of(workload)
        key = (str(root), str(workload))
        if key not in self._cache:
            t = time.perf_counter()
            platform, entry = self._outcome(str(workload), root)
            self._record(key, platform, entry, time.perf_counter() - t)
        return self._cache[key]

    def _record(self, key: tuple[str, str], platform: str | None, entry: tuple, wall_s: float) -> None:
        self._cache[key] = entry
        self._compared[key] = platform
        verdict = entry[3]
        markdown, rules = None, []
        from harness.parity.findings import Verdict

        if isinstance(verdict, Verdict):
            from harness.parity.render.bounded import bounded_verdict
            from harness.parity.render.common import rules_applied_lines

            rules = rules_applied_lines(bounded_verdict(verdict))  # a passing verdict names its rules too
        if verdict is not None and (not verdict.ok or rules):
            from harness.parity.render.markdown import render_markdown

            markdown = render_markdown(verdict)
        changes, self._refresh_changes = self._refresh_changes, None
        self.config._golden_results.append(  # type: ignore[attr-defined]
            {"workload": key[1], "platform": platform, "outcome": entry[0],
             "status": verdict.status if verdict is not None else entry[0],
             "wall_s": round(wall_s, 1), "markdown": markdown, "changes": changes, "rules_applied": rules})

    def adopt_run(self, workload: str, execution) -> bool:
        """Answer ``workload``'s surface checks from ``execution`` (a ``harness.flows.Execution``
        a test of this process made in this session's warm runtime) instead of running the
        workload again, when it is exactly the run :meth:`check` would make: complete, of the spec
        ``workload`` resolves to here (same goldens root and platform, no overrides). The verdict
        is computed as :meth:`check` computes it. False, and nothing changes, when the workload was
        evaluated already, the spec differs, a worker setup hook is set (a planted regression's
        run), or the session refreshes, captures, runs on a Ray cluster or with run options
        (``--golden-option``; those runs are the session's own)."""
        from harness import flows

        root = self.root_of(workload)
        key = (str(root), str(workload))
        if (key in self._cache or self.refresh or self.capture_missing or self.ray_address is not None
                or self.run_options or not execution.ok or os.environ.get("GOLDEN_WORKER_SETUP_HOOK", "").strip()):
            return False
        try:
            spec = flows.spec_for_platform(str(workload), (), self.platform_opt, root)
        except Exception:  # noqa: BLE001 - a spec that does not load: the session's own run says so
            return False
        if spec != execution.spec:
            return False
        platform = flows.platform_of(spec, self.platform_opt)
        try:
            platform = flows.stored_platform(spec, platform, root)
            verdict = flows.compare_with_golden(execution, platform, root)
        except Exception:  # noqa: BLE001 - any problem with the golden: the session's own run reports it
            return False
        self._record(key, platform, ("compared", "", execution, verdict), execution.wall_s)
        return True

    def _outcome(self, workload: str, root: Path) -> tuple[str | None, tuple]:
        from harness import flows
        from harness.parity.tolerances import ToleranceFileError
        from harness.store.atomic import GoldenStoreError

        before = None
        if not (self.refresh or self.capture_missing):  # the prestart's verdicts and plan (files unchanged since)
            from harness import pytest_prestart

            before = pytest_prestart.taken_before_run(self.config, workload, root)
        if before is None:
            before = before_run(workload, root, platform_opt=self.platform_opt, refresh=self.refresh,
                                capture_missing=self.capture_missing, allow_dirty=self.allow_dirty,
                                ray_address=self.ray_address, options=self.run_options)
        if before.decided is not None:
            return before.platform, before.decided
        platform, store, replaces, create = before.platform, before.store, before.replaces, before.create
        progress = self._progress(workload)
        try:
            run_plan = flows.runnable_plan(before.plan)  # the pre-run verdicts' plan: the spec is not read again
            execution = flows.execute(workload, run_dir=self.tmp_root / workload, goldens_root=root,
                                      platform=self.platform_opt, say=progress, ray_address=self.ray_address,
                                      plan=run_plan,
                                      warm=self.warm_runtime(),  # with an address: cold, the reason said
                                      canary="store" if self.refresh or self.capture_missing else "check")
        except Exception as exc:  # noqa: BLE001 - becomes each surface's failure
            return platform, ("error", f"workload {workload} could not run: {type(exc).__name__}: {exc}", None, None)
        finally:
            progress.close()
        from harness import interrupts

        if interrupts.last() is not None:
            raise KeyboardInterrupt  # SIGTERM / Ctrl-C stopped this run: the session ends, nothing else runs
        if not execution.ok:
            return platform, ("incomplete", f"run incomplete (run dir {execution.run_dir}):\n  "
                              + "\n  ".join(execution.problems()), execution, None)
        try:
            if self.refresh:
                self._refresh_changes = self._what_changed(execution, store, root, replaces)
                flows.remember_golden(execution, replaces)  # after the comparison: the golden seen before the run
                flows.store_golden(execution, store, reason=self.reason, goldens_root=root,
                                   command="pytest --golden-refresh", allow_replace=True,
                                   allow_dirty=self.allow_dirty)
                return store, ("refreshed", f"golden {workload}/{store} rewritten", execution, None)
            if create:
                path = flows.store_golden(execution, store, goldens_root=root, allow_replace=False,
                                          reason="first capture (pytest --golden-capture-missing)",
                                          command="pytest --golden-capture-missing", allow_dirty=self.allow_dirty)
                return store, ("created", f"golden {workload}/{store} created at {path}", execution, None)
            verdict = flows.compare_with_golden(execution, platform, root)
            return platform, ("compared", "", execution, verdict)
        except flows.GoldenMissing as exc:  # removed while the workload ran
            return platform, ("missing", str(exc), execution, None)
        except (GoldenStoreError, ToleranceFileError, ValueError, OSError) as exc:
            return platform, ("error", f"{workload}/{platform}: {type(exc).__name__}: {exc}", execution, None)

    def _what_changed(self, execution, store: str, root: Path, replaces: str | None) -> str:
        """The report of the run against the golden a refresh replaces (so a refresh is reviewed,
        not blind); read before the golden is rewritten."""
        from harness import flows
        from harness.parity.render.terminal import render_terminal

        if replaces is None:
            return f"{execution.spec.name}/{store}: no golden was there; the refresh created it"
        try:
            verdict = flows.compare_with_golden(execution, store, root)
        except Exception as exc:  # noqa: BLE001 - the refresh itself decides; the review says why it has none
            return f"{execution.spec.name}/{store}: not compared with the replaced golden ({type(exc).__name__}: {exc})"
        if verdict.ok and verdict.spec is None:
            return f"{execution.spec.name}/{store}: no gated change (the refresh rewrote its provenance)"
        return render_terminal(verdict, title=f"{execution.spec.name}/{store}: replaced golden -> this run",
                               color=False, limit=5)

    def _progress(self, workload: str):
        """Progress lines with a heartbeat (``harness.progress``) for one workload's run, on the
        real stderr: pytest captures fd 2 while a test runs, so they go to a duplicate of it
        taken with capture suspended. ``GOLDEN_PROGRESS=off`` silences them."""
        from harness.progress import MODE_ENV, make_progress

        if os.environ.get(MODE_ENV, "").strip().lower() == "off":
            return make_progress(mode="off")
        if self._progress_stream is None:
            capman = self.config.pluginmanager.getplugin("capturemanager")
            if capman is not None:
                with capman.global_and_fixture_disabled():
                    fd = os.dup(2)
            else:
                fd = os.dup(2)
            self._progress_stream = os.fdopen(fd, "w", buffering=1)
        self._progress_stream.write("\n")  # after pytest's "path::test" text
        return make_progress(stream=self._progress_stream, mode="plain", label=f"golden {workload}")

    def check(self, workload: str, surface: str) -> None:
        """Fail the calling test with readable findings if ``surface`` differs."""
        problem = getattr(workload, "problem", None)
        if problem:
            pytest.fail(problem, pytrace=False)
        outcome, message, execution, verdict = self._evaluate(workload)
        if outcome in ("error", "incomplete", "missing"):
            pytest.fail(message, pytrace=False)
        if outcome in ("refreshed", "created"):
            self.stored_by_current_test = outcome  # read by pytest_runtest_makereport: "CREATED" / "REFRESHED"
            return
        result = verdict.surfaces.get(surface)
        if not (verdict.spec is not None and verdict.spec.gating) and (result is None or result.status == "parity"):
            absent = [f.note for f in (result.findings if result is not None else ()) if f.section is None
                      and f.status == "info" and "not in this golden" in f.note]
            if absent:   # an optional surface a golden from before it lacks: not gated, and said so
                pytest.skip(f"{workload}/{surface}: {absent[0]}")
            return
        from harness import flows
        from harness.parity.findings import Verdict
        from harness.parity.render.terminal import render_terminal
        from harness.store.variants import unrecorded_note

        root = self.root_of(workload)
        if execution is None:  # refused before the run: the spec differs from the golden's
            from harness.store.variants import base_platform

            stored = self._compared.get((str(root), str(workload))) or self.platform_opt
            platform = base_platform(stored) if stored else stored
            pytest.fail(f"{workload}/{surface}: fail before any run\n" + "\n".join(verdict.spec.lines())
                        + "\n" + refresh_hint_text(workload, platform, root), pytrace=False)
        surfaces = {surface: result} if result is not None else {}
        one = Verdict(deterministic=verdict.deterministic, surfaces=surfaces, spec=verdict.spec,
                      lane_source=verdict.lane_source)
        platform = flows.platform_of(execution.spec, self.platform_opt)
        stored = self._compared.get((str(root), str(workload))) or platform
        note = unrecorded_note(root, workload, stored, flows.numerics_key_of(execution.spec))
        status = result.status if result is not None and result.status != "parity" else "fail"
        pytest.fail(
            f"{workload}/{surface}: {status} (run dir {execution.run_dir})\n"
            + render_terminal(one, title=f"{workload}/{surface}", color=False)
            + "\n" + refresh_hint_text(workload, platform, root) + (f"\n{note}" if note else ""),
            pytrace=False,
        )


def refresh_hint_text(workload: str, platform: str | None, root: Path | None) -> str:
    """How to accept a change, as commands acting on the same goldens root and platform
    (``harness.cli.hints``; the root is repeated unless it is the default one)."""
    from harness.cli.hints import golden_command, pytest_refresh_hint, root_if_chosen

    chosen = root_if_chosen(root)
    cli = golden_command("refresh", workload, platform=platform, goldens_root=chosen, reason=True)
    return (f"if the change is intended, refresh the golden: {cli}\n"
            f"  (or: {pytest_refresh_hint(workload, platform=platform, goldens_root=chosen)})")
