"""pytest plugin ``golden`` (pytest11 entry point): golden tests for GRPO workloads.

Use in any repository::

    # test_goldens.py
    from harness.pytest_plugin import golden_params
    import pytest

    @pytest.mark.golden
    @pytest.mark.parametrize("workload,surface", golden_params())
    def test_golden(golden, workload, surface):
        golden.check(workload, surface)

One test per workload x surface. Each workload runs once per pytest process
(cached, including a failure to run or to read its golden). Under
pytest-xdist the parameters carry ``xdist_group`` marks and a plain ``-n N``
(no ``--dist`` given) is run as ``--dist loadgroup`` (identical to ``load``
for tests without the mark), so a workload's surfaces stay on one worker and
it runs once in total; workers send their results to the controller, which
prints the summary and writes ``--golden-summary``. A missing or unreadable
golden fails the workload's tests before it runs. Failures print the
findings of that surface (surface, section with coordinates, key, golden vs
actual, lane) without opening any file, then how to refresh the golden if the
change is intended.

Options: ``--golden-refresh --golden-reason TEXT`` rewrites the goldens of the
selected workloads (atomically, with provenance) instead of failing;
``--golden-platform`` (default: ``$GOLDEN_PLATFORM`` or the spec's device);
``--golden-root`` (default: the repository's ``goldens/``);
``--golden-summary PATH`` writes a Markdown summary for a CI job page.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

GATED_SURFACES = ("topology", "lifecycle", "operators", "collectives", "rollouts", "training")

# --golden-root / --golden-platform of this session, set in pytest_configure (before
# test modules are imported), so golden_params() selects what GoldenSession checks.
_SESSION_OPTIONS: dict[str, str | None] = {"root": None, "platform": None}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("golden", "GRPO golden regression gate")
    group.addoption("--golden-refresh", action="store_true", default=False,
                    help="rewrite the selected goldens instead of comparing (needs --golden-reason)")
    group.addoption("--golden-reason", default=None, help="why the goldens are refreshed (recorded in PROVENANCE.json)")
    group.addoption(
        "--golden-platform", default=None, help="golden platform (default: $GOLDEN_PLATFORM or spec device)"
    )
    group.addoption("--golden-root", default=None, help="goldens directory (default: the repository's goldens/)")
    group.addoption("--golden-summary", default=None, help="write a Markdown summary of golden results here")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "golden: runs a golden workload and compares one surface with its golden")
    if config.getoption("--golden-refresh") and not (config.getoption("--golden-reason") or "").strip():
        raise pytest.UsageError("--golden-refresh needs --golden-reason TEXT (it is recorded in PROVENANCE.json)")
    config._golden_results = []  # type: ignore[attr-defined]
    _SESSION_OPTIONS.update(root=config.getoption("--golden-root"), platform=config.getoption("--golden-platform"))
    _group_workloads_under_xdist(config)


def _group_workloads_under_xdist(config: pytest.Config) -> None:
    """``-n N`` without ``--dist``: xdist would pick ``load`` and spread one
    workload's surfaces over several workers, each running the workload again.
    ``loadgroup`` keeps each ``xdist_group`` on one worker and distributes
    every other test exactly as ``load`` does. An explicit ``--dist`` wins.

    A worker decides whether to group from its own command line, so the
    controller tells it through ``workerinput`` (``pytest_configure_node``)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if workerinput.get("golden_loadgroup"):
            config.option.loadgroup = True
        return
    if getattr(config.option, "dist", "no") != "load" or getattr(config.option, "distload", False):
        return
    given = [*config.invocation_params.args, *os.environ.get("PYTEST_ADDOPTS", "").split(),
             *config.getini("addopts")]
    if any(str(a).startswith("--dist") for a in given):
        return
    config.option.dist = "loadgroup"
    config._golden_loadgroup = True  # type: ignore[attr-defined]
    if _loadgroup_broken():
        warnings.warn(pytest.PytestWarning(
            f"pytest {pytest.__version__} with pytest-xdist {_xdist_version()}: --dist loadgroup does not group "
            "(pytest-dev/pytest-xdist#1386), so each golden workload may run once per worker; "
            "use pytest < 9.2 (the harness's dev extra pins it) or a fixed pytest-xdist"), stacklevel=1)


def _xdist_version() -> str:
    try:
        from importlib.metadata import version

        return version("pytest-xdist")
    except Exception:  # noqa: BLE001 - metadata missing: unknown version
        return "unknown"


def _loadgroup_broken() -> bool:
    """pytest >= 9.2 ignores xdist <= 3.8's nodeid suffix, which is how loadgroup groups."""
    def parts(text: str) -> tuple[int, ...]:
        out = []
        for piece in text.split(".")[:3]:
            digits = "".join(c for c in piece if c.isdigit())
            out.append(int(digits) if digits else 0)
        return tuple(out)

    xdist = _xdist_version()
    return parts(pytest.__version__) >= (9, 2) and xdist != "unknown" and parts(xdist) <= (3, 8, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: pass the loadgroup upgrade on to each worker."""
    if getattr(node.config, "_golden_loadgroup", False):
        node.workerinput["golden_loadgroup"] = True


def golden_params(goldens_root: str | Path | None = None, platform: str | None = None) -> list:
    """``pytest.param(workload, surface)`` for every workload scheduled on ``platform``.

    ``platform``: explicit, else ``--golden-platform``, else ``$GOLDEN_PLATFORM``,
    else the host a plain ``pytest -m golden`` runs on: the CPU (``cpu``, or
    ``cpu-vllm`` for a vLLM workload on cpu). A cuda workload needs
    ``GOLDEN_PLATFORM=cuda``, as ci/l2.sh sets. ``goldens_root``: explicit, else
    ``--golden-root``, else ``$GOLDEN_ROOT``, else the repository's goldens/.

    A workload whose spec does not load is still listed: its tests fail with the
    spec error (file and field) instead of one typo failing the whole collection."""
    from harness.rollout.vllm import vllm_available  # stdlib only
    from harness.spec.errors import SpecError
    from harness.spec.load import default_goldens_root, golden_platform, list_workloads, load_spec

    root = Path(goldens_root or _SESSION_OPTIONS["root"] or os.environ.get("GOLDEN_ROOT") or default_goldens_root())
    platform = platform or _SESSION_OPTIONS["platform"]
    params = []
    for name in list_workloads(root):
        try:
            spec = load_spec(name, goldens_root=root)
        except SpecError:
            params.extend(pytest.param(name, surface, id=f"{name}-{surface}", marks=[pytest.mark.xdist_group(name)])
                          for surface in GATED_SURFACES)
            continue
        host_default = golden_platform(spec) if spec["platform"]["device"] == "cpu" else "cpu"
        plat = platform or os.environ.get("GOLDEN_PLATFORM") or host_default
        if plat not in spec["platform"]["platforms"]:
            continue
        marks = [pytest.mark.xdist_group(name)]
        if spec["rollout"]["backend"] == "vllm":
            marks.append(pytest.mark.skipif(not vllm_available(), reason=(
                "rollout.backend: vllm and vllm is not installed: the optional tier ci/l3_vllm.sh runs this golden")))
        if spec["policy"].get("backend") == "megatron":
            marks.append(pytest.mark.megatron)  # needs megatron-core: selectable, never skipped
        for surface in GATED_SURFACES:
            params.append(pytest.param(name, surface, id=f"{name}-{surface}", marks=marks))
    return params


class GoldenSession:
    """Runs each workload once and answers per-surface checks from the cache."""

    def __init__(self, config: pytest.Config, tmp_root: Path) -> None:
        from harness.spec.load import default_goldens_root

        self.config = config
        self.tmp_root = tmp_root
        self.root = Path(config.getoption("--golden-root") or os.environ.get("GOLDEN_ROOT") or default_goldens_root())
        self.platform_opt = config.getoption("--golden-platform")
        self.refresh = bool(config.getoption("--golden-refresh"))
        self.reason = config.getoption("--golden-reason")
        self._cache: dict[str, tuple] = {}
        self._progress_stream = None
        self._warm = None  # harness.runner.warm.WarmRuntime, created on the first workload

    def warm_runtime(self):
        """This process's warm runtime (one Ray instance + warm worker processes shared by its
        workloads, docs/runner.md); None with ``GOLDEN_WARM=0`` (every workload cold)."""
        if os.environ.get("GOLDEN_WARM", "1").strip() == "0":
            return None
        if self._warm is None:
            from harness.runner.warm import WarmRuntime  # ray is imported only when it starts

            self._warm = WarmRuntime()
        return self._warm

    def close_warm(self) -> None:
        if self._warm is not None:
            self._warm.close()

    def _evaluate(self, workload: str) -> tuple:
        """``(outcome, message, execution, verdict)``, computed once per workload:
        every outcome is cached, so a workload never runs twice in one process."""
        if workload not in self._cache:
            t = time.perf_counter()
            platform, entry = self._outcome(workload)
            self._cache[workload] = entry
            verdict = entry[3]
            markdown = None
            if verdict is not None and not verdict.ok:
                from harness.parity.render.markdown import render_markdown

                markdown = render_markdown(verdict)
            self.config._golden_results.append(  # type: ignore[attr-defined]
                {"workload": workload, "platform": platform, "outcome": entry[0],
                 "status": verdict.status if verdict is not None else entry[0],
                 "wall_s": round(time.perf_counter() - t, 1), "markdown": markdown})
        return self._cache[workload]

    def _outcome(self, workload: str) -> tuple[str | None, tuple]:
        from harness import flows
        from harness.parity.tolerances import ToleranceFileError
        from harness.store.atomic import GoldenStoreError

        platform = self.platform_opt
        try:
            spec = flows.spec_for_platform(workload, (), self.platform_opt, self.root)
            platform = flows.platform_of(spec, self.platform_opt)
            if self.refresh:
                if platform not in spec["platform"]["platforms"]:
                    why = (f"cannot refresh {workload}: platform {platform!r} is not scheduled "
                           f"(platform.platforms = {spec['platform']['platforms']})")
                    return platform, ("error", why, None, None)
            else:
                flows.load_golden(self.root, spec["name"], platform)  # refuse before running, not after
        except flows.GoldenMissing as exc:
            return platform, ("missing", str(exc), None, None)
        except (GoldenStoreError, ToleranceFileError) as exc:
            return platform, ("error", f"golden {workload}/{platform} is unusable: {exc}", None, None)
        except Exception as exc:  # noqa: BLE001 - a bad spec becomes each surface's failure
            return platform, ("error", f"workload {workload}: {type(exc).__name__}: {exc}", None, None)
        progress = self._progress(workload)
        try:
            execution = flows.execute(workload, run_dir=self.tmp_root / workload, goldens_root=self.root,
                                      platform=self.platform_opt, say=progress, warm=self.warm_runtime())
        except Exception as exc:  # noqa: BLE001 - becomes each surface's failure
            return platform, ("error", f"workload {workload} could not run: {type(exc).__name__}: {exc}", None, None)
        finally:
            progress.close()
        if not execution.ok:
            return platform, ("incomplete", f"run incomplete (run dir {execution.run_dir}):\n  "
                              + "\n  ".join(execution.problems()), execution, None)
        try:
            if self.refresh:
                flows.store_golden(execution, platform, reason=self.reason, goldens_root=self.root,
                                   command="pytest --golden-refresh", allow_replace=True)
                return platform, ("refreshed", f"golden {workload}/{platform} rewritten", execution, None)
            verdict = flows.compare_with_golden(execution, platform, self.root)
            return platform, ("compared", "", execution, verdict)
        except flows.GoldenMissing as exc:  # removed while the workload ran
            return platform, ("missing", str(exc), execution, None)
        except (GoldenStoreError, ToleranceFileError, ValueError, OSError) as exc:
            return platform, ("error", f"{workload}/{platform}: {type(exc).__name__}: {exc}", execution, None)

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
        outcome, message, execution, verdict = self._evaluate(workload)
        if outcome in ("error", "incomplete", "missing"):
            pytest.fail(message, pytrace=False)
        if outcome == "refreshed":
            return
        result = verdict.surfaces.get(surface)
        if result is None or result.status == "parity":
            return
        from harness.parity.findings import Verdict
        from harness.parity.render.terminal import render_terminal

        one = Verdict(deterministic=verdict.deterministic, surfaces={surface: result})
        from harness import flows

        platform = flows.platform_of(execution.spec, self.platform_opt)
        pytest.fail(
            f"{workload}/{surface}: {result.status} (run dir {execution.run_dir})\n"
            + render_terminal(one, title=f"{workload}/{surface}", color=False)
            + "\n" + refresh_hint_text(workload, platform, self.root),
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


@pytest.fixture(scope="session")
def golden(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GoldenSession]:
    """The session-wide golden runner (see module docstring)."""
    session = GoldenSession(request.config, tmp_path_factory.mktemp("golden-runs"))
    request.config._golden_session = session  # type: ignore[attr-defined]
    yield session
    session.close_warm()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The warm runtime (Ray + warm processes) lives across consecutive golden tests only:
    before a test that does not use the ``golden`` fixture it is shut down, so that test
    finds no Ray instance of ours (it starts again for the next golden test)."""
    session = getattr(item.config, "_golden_session", None)
    if session is not None and (nextitem is None or "golden" not in getattr(nextitem, "fixturenames", ())):
        session.close_warm()


def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    """On an xdist worker: hand the results (plain data) to the controller."""
    config = session.config
    if hasattr(config, "workeroutput"):
        config.workeroutput["golden_results"] = list(getattr(config, "_golden_results", []))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """On the xdist controller: collect a finished worker's golden results."""
    results = getattr(node, "workeroutput", {}).get("golden_results") or []
    node.config._golden_results.extend(results)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports
        return
    results = sorted(getattr(config, "_golden_results", []), key=lambda r: (r["workload"], r["platform"] or ""))
    if not results:
        return
    tr = terminalreporter
    tr.section("golden workloads")
    total = 0.0
    for r in results:
        tr.write_line(f"{r['workload']:<36} {r['platform'] or '-':<8} {r['status']:<10} {r['wall_s']:>7.1f}s")
        total += r["wall_s"]
    tr.write_line(f"golden wall time: {total:.1f}s")
    path = config.getoption("--golden-summary")
    if path:
        lines = ["## Golden gate", "", "| workload | platform | result | wall s |", "|---|---|---|---|"]
        for r in results:
            lines.append(f"| {r['workload']} | {r['platform'] or '-'} | {r['status']} | {r['wall_s']} |")
        for r in results:
            if r["markdown"]:
                lines += ["", f"### {r['workload']}", "", r["markdown"]]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("\n".join(lines) + "\n")
