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

Fail closed: no goldens root, no workload selected, a spec that does not load,
a backend package that is not installed (megatron-core, vllm: the message names
the install command) or a scheduled workload x platform without a golden is a
*failing* test naming what is missing, never an empty parameter set or a skip;
deselect a backend's workloads by marker (``-m "not vllm"``) to leave them out.
Every marker the plugin puts on a test (``golden``, ``megatron``, ``vllm``,
``xdist_group``) is registered by the plugin, so ``--strict-markers`` collects.

Where the goldens live (``harness.spec.roots``, the same order as the ``golden``
command): ``--goldens-root DIR``, else ``$GOLDEN_ROOT``, else ``goldens-root`` of
a ``[tool.golden]`` table in the nearest ``pyproject.toml`` above the invocation
directory (or pytest's rootdir), else the harness checkout's own ``goldens/`` (a
source checkout only), else ``./goldens``.
``[tool.golden] workloads = [...]`` selects workloads, which may be built-in ones
the root has no spec for yet; without it every workload under the root is
scheduled on the session's platform.

Options: ``--golden-capture-missing`` runs a workload whose golden is missing and
stores it (with provenance; a built-in workload's spec is copied into the root),
and its tests pass as "created"; a later run compares against it.
``--golden-refresh --golden-reason TEXT`` rewrites the goldens of the
selected workloads (atomically, with provenance) instead of failing;
``--golden-platform`` (default: ``$GOLDEN_PLATFORM`` or the spec's device);
``--golden-summary PATH`` writes a Markdown summary for a CI job page. Goldens
of the session's platforms that no test targets are reported as unused;
``--golden-strict-unused`` makes them fail the session. ``--golden-root`` (the
old spelling) is refused with a message naming ``--goldens-root``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.pytest_session import GoldenSession

# the gated surfaces, then the optional one (docs/gate.md, "Optional surfaces"): a golden
# without it skips that test, saying "not in this golden (refresh to gate it)"
GATED_SURFACES = ("topology", "lifecycle", "operators", "collectives", "rollouts", "training", "numerics")

MARKERS = (
    "golden: runs a golden workload and compares one surface with its golden",
    "megatron: the workload needs megatron-core (policy.backend: megatron); deselect with -m 'not megatron'",
    "vllm: the workload needs vllm (rollout.backend: vllm); deselect with -m 'not vllm'",
    "xdist_group(name): keeps a golden workload's tests on one pytest-xdist worker",
    ("golden_uses(*workloads, files=()): a golden test that is no golden_params test runs the code of these "
     "workloads (and reads these files); --golden-since runs it only when one of them is affected"),
)

# Options of this session, set in pytest_configure (before test modules are imported), so
# golden_params() selects what GoldenSession checks; and what golden_params() found, for the
# unused-goldens report.
_SESSION_OPTIONS: dict = {"root": None, "platform": None, "starts": (None, None), "capture_missing": False}
_SESSION_GOLDENS: dict = {"scheduled": set(), "present": set(), "platforms": set()}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("golden", "GRPO golden regression gate")
    group.addoption("--goldens-root", default=None,
                    help="the repository's goldens folder (default: $GOLDEN_ROOT, else [tool.golden] goldens-root "
                         "in pyproject.toml, else the harness checkout's goldens/)")
    group.addoption("--golden-root", dest="golden_root_old_spelling", default=None, help=argparse.SUPPRESS)
    group.addoption("--golden-capture-missing", action="store_true", default=False,
                    help="run and store the goldens that are missing (first capture); their tests pass as created")
    group.addoption("--golden-allow-dirty", action="store_true", default=False,
                    help="--golden-refresh / --golden-capture-missing store even with uncommitted changes outside "
                         "the goldens root (their digest is recorded); refused otherwise")
    group.addoption("--golden-strict-unused", action="store_true", default=False,
                    help="fail the session when a stored golden of the session's platforms is used by no test")
    group.addoption("--golden-refresh", action="store_true", default=False,
                    help="rewrite the selected goldens instead of comparing (needs --golden-reason)")
    group.addoption("--golden-reason", default=None, help="why the goldens are refreshed (recorded in PROVENANCE.json)")
    group.addoption(
        "--golden-platform", default=None, help="golden platform (default: $GOLDEN_PLATFORM or spec device)"
    )
    group.addoption("--golden-summary", default=None, help="write a Markdown summary of golden results here")
    group.addoption("--golden-since", default=None, metavar="BASE",
                    help="run only the golden workloads a change since the git revision BASE can affect "
                         "(harness.footprint; the others are reported as not affected, never as passed)")
    group.addoption("--golden-option", action="append", default=[], metavar="FIELD=VALUE",
                    help="a run option of every golden run (harness.spec.runplan.SWITCHES: worker_logs, "
                         "cuda_graphs, decode_kernels, grouped_fp32, collective_timeout_s; docs/spec.md)")
    group.addoption("--golden-ray-address", default=None, metavar="ADDR",
                    help="run every golden on this Ray cluster (cold, placed from the plan; docs/cluster.md) "
                         "instead of the warm local runtime")


# The plugin's options that take a value. pytest finds its rootdir and configfile before it loads
# any plugin, so in the space form (``--goldens-root DIR``) it reads DIR as a path argument
# (pytest-dev/pytest#8846); the plugin then gets the value right, but pytest's setup may be off.
VALUE_OPTIONS = ("--goldens-root", "--golden-platform", "--golden-reason", "--golden-summary", "--golden-ray-address",
                 "--golden-since", "--golden-option")


def space_form_values(args: list[str]) -> list[tuple[str, str]]:
    """``(option, value)`` for each of :data:`VALUE_OPTIONS` given as two words in ``args``."""
    return [(a, args[i + 1]) for i, a in enumerate(args[:-1]) if a in VALUE_OPTIONS and not args[i + 1].startswith("-")]


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """Both spellings (``--goldens-root DIR`` and ``--goldens-root=DIR``) work, except where the
    space form changed pytest's rootdir or configfile (a value that is an existing path outside the
    project, read as a test path before this plugin was loaded): then a usage error names the
    ``=`` spelling, instead of a session run from the wrong rootdir without its configfile."""
    given = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *map(str, early_config.invocation_params.args)]
    spaced = space_form_values(given)
    if not spaced:
        return
    try:
        import copy
        import inspect

        from _pytest.config.findpaths import determine_setup

        ns = early_config._parser.parse_known_args(given, namespace=copy.copy(early_config.option))
        wanted = dict(inifile=ns.inifilename, override_ini=getattr(ns, "override_ini", None), args=ns.file_or_dir,
                      rootdir_cmd_arg=ns.rootdir or None, invocation_dir=early_config.invocation_params.dir)
        params = inspect.signature(determine_setup).parameters
        setup = determine_setup(**{k: v for k, v in wanted.items() if k in params})
    except Exception:  # noqa: BLE001 - a pytest whose internals differ: leave its setup as it is
        return
    rootpath, inipath = Path(setup[0]), (Path(setup[1]) if setup[1] else None)
    if rootpath == early_config.rootpath and inipath == early_config.inipath:
        return
    fix = " ".join(f"{option}={shlex.quote(value)}" for option, value in spaced)
    raise pytest.UsageError(
        f"{' '.join(f'{o} {shlex.quote(v)}' for o, v in spaced)}: pytest read the value as a test path before the "
        f"golden plugin was loaded, so its rootdir became {early_config.rootpath} (configfile "
        f"{early_config.inipath or 'none'}) instead of {rootpath} (configfile {inipath or 'none'}); "
        f"write it with '=': {fix}")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if config.getoption("golden_root_old_spelling") is not None:
        raise pytest.UsageError("--golden-root was renamed --goldens-root (the spelling the golden command uses)")
    if config.getoption("--golden-refresh") and not (config.getoption("--golden-reason") or "").strip():
        raise pytest.UsageError("--golden-refresh needs --golden-reason TEXT (it is recorded in PROVENANCE.json)")
    if config.getoption("--golden-refresh") and config.getoption("--golden-capture-missing"):
        raise pytest.UsageError("--golden-refresh rewrites every selected golden, --golden-capture-missing only "
                                "creates missing ones: give one of them")
    config._golden_results = []  # type: ignore[attr-defined]
    config._golden_unused = set()  # type: ignore[attr-defined]
    _SESSION_OPTIONS.update(root=config.getoption("--goldens-root"), platform=config.getoption("--golden-platform"),
                            starts=(config.invocation_params.dir, config.rootpath),
                            capture_missing=bool(config.getoption("--golden-capture-missing")))
    for key in _SESSION_GOLDENS:
        _SESSION_GOLDENS[key] = set()
    _pin_cpu_session(config)
    _group_workloads_under_xdist(config)


def _pin_cpu_session(config: pytest.Config) -> None:
    """A session whose goldens run on the CPU pins its CPU code paths now, before any torch
    kernel runs or any warm process starts, so the whole session (its workers, and tests that
    compare in-process math with them) computes one machine-independent set of bits
    (``harness.portable.pins``; ``GOLDEN_CPU_PINS=0`` leaves it unpinned). A cuda or
    ``cpu-vllm`` session is left as it is."""
    from harness.portable import pins
    from harness.store.variants import base_platform

    platform = config.getoption("--golden-platform") or os.environ.get("GOLDEN_PLATFORM") or "cpu"
    if base_platform(platform) in ("cpu", "cpu-cluster"):
        pins.apply_to_environ()


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


class GoldenWorkload(str):
    """A workload name as a test parameter, carrying what ``golden_params`` resolved:
    the goldens root it was found under and, for a problem found at collection
    (no root, nothing selected, a bad ``[tool.golden]`` table), the message its
    test fails with."""

    root: Path | None = None
    problem: str | None = None

    @classmethod
    def make(cls, name: str, root: Path | None = None, problem: str | None = None) -> GoldenWorkload:
        value = cls(name)
        value.root, value.problem = root, problem
        return value


def _problem_param(test_id: str, message: str):
    """One failing test that says what is missing (instead of an empty, skipped parameter set)."""
    return pytest.param(GoldenWorkload.make(test_id, problem=message), "-", id=test_id,
                        marks=[pytest.mark.golden])


def _session_config(goldens_root: str | Path | None):
    from harness.spec.roots import goldens_config

    start, also = _SESSION_OPTIONS["starts"]
    if goldens_root:
        return goldens_config(goldens_root, start=start, also_start=also, explicit_source="golden_params(goldens_root)")
    return goldens_config(_SESSION_OPTIONS["root"], start=start, also_start=also)


def _stored_goldens(root: Path) -> set[tuple[str, str, str]]:
    """(root, workload, platform) of every ``<root>/<workload>/<platform>/`` folder."""
    if not root.is_dir():
        return set()
    return {(str(root), w.name, p.name) for w in root.iterdir() if w.is_dir() and not w.name.startswith(".")
            for p in w.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}


def golden_params(goldens_root: str | Path | None = None, platform: str | None = None) -> list:
    """``pytest.param(workload, surface)`` for every workload scheduled on ``platform``.

    ``platform``: explicit, else ``--golden-platform``, else ``$GOLDEN_PLATFORM``,
    else the host a plain ``pytest -m golden`` runs on: the CPU (``cpu``, or
    ``cpu-vllm`` for a vLLM workload on cpu). A cuda workload needs
    ``GOLDEN_PLATFORM=cuda``, as ci/l2.sh sets. ``goldens_root``: explicit, else
    ``--goldens-root``, else ``$GOLDEN_ROOT``, else ``[tool.golden]`` in
    pyproject.toml, else the harness checkout's goldens/ (``harness.spec.roots``).
    Workloads: ``[tool.golden] workloads`` if given, else every spec under the root.

    Never empty: a missing root or an empty selection is one failing test that
    says so. A workload whose spec does not load is still listed: its tests
    fail with the spec error (file and field) instead of one typo failing the
    whole collection."""
    from harness.spec.backends import backends_of
    from harness.spec.errors import SpecError
    from harness.spec.load import golden_platform, list_workloads, load_spec
    from harness.spec.roots import HOW_TO_NAME_A_ROOT

    try:
        cfg = _session_config(goldens_root)
    except SpecError as exc:
        return [_problem_param("golden-config", str(exc))]
    root = cfg.root.resolve()
    capture = _SESSION_OPTIONS["capture_missing"]
    if not root.is_dir() and not (capture and cfg.workloads):
        how = HOW_TO_NAME_A_ROOT if not cfg.explicit else "create it or point the option at the right folder"
        first = ("; for a first capture, select workloads with [tool.golden] workloads = [...] and run "
                 "pytest --golden-capture-missing")
        return [_problem_param("no-goldens-root", f"goldens root {root} does not exist (from {cfg.source}): "
                                                  f"{how}{first}")]
    names = list(cfg.workloads) if cfg.workloads else list_workloads(root)
    if not names:
        return [_problem_param("no-workload-selected",
                               f"no workload selected: no {root}/<workload>/workload.yaml and no "
                               "[tool.golden] workloads = [...] in pyproject.toml")]
    platform = platform or _SESSION_OPTIONS["platform"]
    params = []
    for name in names:
        workload = GoldenWorkload.make(name, root)
        try:
            spec = load_spec(name, goldens_root=root)
        except SpecError:
            params.extend(pytest.param(workload, surface, id=f"{name}-{surface}",
                                       marks=[pytest.mark.golden, pytest.mark.xdist_group(name)])
                          for surface in GATED_SURFACES)
            _SESSION_GOLDENS["scheduled"].update((str(root), name, p.name) for p in (root / name).glob("*/"))
            continue
        host_default = golden_platform(spec) if spec.platform.device == "cpu" else "cpu"
        plat = platform or os.environ.get("GOLDEN_PLATFORM") or host_default
        _SESSION_GOLDENS["platforms"].add((str(root), plat))
        if plat not in spec.platform.platforms:
            continue
        _SESSION_GOLDENS["scheduled"].add((str(root), name, plat))
        # A backend's marker selects or deselects its workloads; an absent package fails them (never a skip).
        marks = [pytest.mark.golden, pytest.mark.xdist_group(name),
                 *(getattr(pytest.mark, backend.marker) for backend in backends_of(spec))]
        for surface in GATED_SURFACES:
            params.append(pytest.param(workload, surface, id=f"{name}-{surface}", marks=marks))
    _SESSION_GOLDENS["present"].update(_stored_goldens(root))
    if not params:
        where = platform or os.environ.get("GOLDEN_PLATFORM") or "the host's platform"
        return [_problem_param("no-workload-selected", f"no workload selected: none of {', '.join(names)} "
                                                       f"(under {root}) is scheduled on {where}")]
    return params


def _nothing_scheduled_goldens() -> None:
    """When no test called ``golden_params`` (no golden test collected), every stored golden of the
    session's goldens root on the session's platform is unused: fill the tables from the root."""
    if _SESSION_GOLDENS["platforms"] or _SESSION_GOLDENS["scheduled"]:
        return
    from harness.spec.errors import SpecError

    try:
        root = _session_config(None).root.resolve()
    except (SpecError, OSError):
        return
    platform = _SESSION_OPTIONS["platform"] or os.environ.get("GOLDEN_PLATFORM") or "cpu"
    _SESSION_GOLDENS["platforms"].add((str(root), platform))
    _SESSION_GOLDENS["present"].update(_stored_goldens(root))


def unused_goldens() -> list[str]:
    """Stored goldens of this session's platforms that no collected test targets, as ``root/workload/platform``."""
    platforms = _SESSION_GOLDENS["platforms"]
    return sorted(f"{root}/{w}/{p}" for root, w, p in _SESSION_GOLDENS["present"] - _SESSION_GOLDENS["scheduled"]
                  if (root, p) in platforms)


@pytest.fixture(scope="session")
def golden(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GoldenSession]:
    """The session-wide golden runner (see module docstring). While it lives, SIGTERM ends
    the session as Ctrl-C does (``harness.interrupts``): the running workload is stopped and
    marked interrupted, no further workload runs, and pytest exits 143 (130 for Ctrl-C)."""
    from harness import interrupts

    session = GoldenSession(request.config, tmp_path_factory.mktemp("golden-runs"),
                            session_root=lambda: _session_config(None).root.resolve())
    request.config._golden_session = session  # type: ignore[attr-defined]
    interrupts.reset()
    previous = interrupts.install()
    try:
        yield session
    finally:
        session.close_warm()
        interrupts.restore(previous)


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    """A golden-only session starts its warm runtime while it collects when one of the workloads
    its goldens root schedules would run (``harness.pytest_prestart``: never for verdicts decided
    from files, such as a missing root, golden or spec, or a spec the golden's differs from)."""
    from harness import pytest_prestart
    from harness.spec.errors import SpecError
    from harness.spec.load import list_workloads

    try:
        cfg = _session_config(None)
        root = cfg.root.resolve()
        names = list(cfg.workloads) if cfg.workloads else (list_workloads(root) if root.is_dir() else [])
    except (SpecError, OSError):
        return
    from harness.pytest_since import affected_names

    names = affected_names(session.config, root, names)  # --golden-since: only what can run
    pytest_prestart.start(session.config, [(name, root) for name in names])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """``--golden-since BASE``: deselect the golden tests of workloads no change since BASE can
    affect (``harness.pytest_since``)."""
    base = config.getoption("--golden-since")
    if base:
        from harness import pytest_since

        pytest_since.deselect_unaffected(config, items, base, _session_config(None).root.resolve(),
                                         _SESSION_OPTIONS["platform"])


def pytest_collection_finish(session: pytest.Session) -> None:
    """A prestarted runtime's zygote starts the flavours the selected golden workloads need."""
    from harness import pytest_prestart

    pytest_prestart.start_flavours(session.config, session.items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A prestarted runtime is never up while a test without the ``golden`` fixture runs."""
    if "golden" not in getattr(item, "fixturenames", ()):
        from harness import pytest_prestart

        pytest_prestart.discard(item.config)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The warm runtime (Ray + warm processes) lives across consecutive golden tests only:
    before a test that does not use the ``golden`` fixture it is shut down, so that test
    finds no Ray instance of ours (it starts again for the next golden test)."""
    session = getattr(item.config, "_golden_session", None)
    if session is not None and (nextitem is None or "golden" not in getattr(nextitem, "fixturenames", ())):
        session.close_warm()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A passing test whose golden this session created or rewrote says so (``user_properties``,
    which reach the xdist controller and JUnit): shown as ``C``/``CREATED`` (``R``/``REFRESHED``)."""
    report = yield
    session = getattr(item, "funcargs", {}).get("golden")
    if isinstance(session, GoldenSession) and call.when == "call":
        stored, session.stored_by_current_test = session.stored_by_current_test, None
        if stored and report.passed:
            report.user_properties.append(("golden", stored))
    return report


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    if report.when == "call" and report.passed:
        for key, value in report.user_properties:
            if key == "golden" and value in ("created", "refreshed"):
                return "passed", value[0].upper(), value.upper()
    return None


def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    """Close a prestarted runtime no test took; on an xdist worker: hand the results (plain
    data) to the controller."""
    config = session.config
    from harness import pytest_prestart

    pytest_prestart.discard(config)
    if config.getoption("--golden-strict-unused"):
        _nothing_scheduled_goldens()  # no golden test collected: the root's goldens are all unused
    config._golden_unused.update(unused_goldens())  # type: ignore[attr-defined]
    if hasattr(config, "workeroutput"):
        config.workeroutput["golden_results"] = list(getattr(config, "_golden_results", []))
        config.workeroutput["golden_unused"] = sorted(config._golden_unused)  # type: ignore[attr-defined]
        return
    strict_fail = config._golden_unused and config.getoption("--golden-strict-unused")  # type: ignore[attr-defined]
    if strict_fail and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # (no test collected: they are named, not exit 5)
    from harness import interrupts, pytest_since

    if pytest_since.nothing_affected(config) and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK  # nothing to gate: said so in the summary, nothing reads as passed
    if interrupts.last() is not None and session.exitstatus == pytest.ExitCode.INTERRUPTED:
        session.exitstatus = interrupts.exit_code()  # 143 SIGTERM, 130 Ctrl-C (issue 41)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """On the xdist controller: collect a finished worker's golden results."""
    output = getattr(node, "workeroutput", {})
    node.config._golden_results.extend(output.get("golden_results") or [])
    node.config._golden_unused.update(output.get("golden_unused") or [])


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports
        return
    results = sorted(getattr(config, "_golden_results", []), key=lambda r: (r["workload"], r["platform"] or ""))
    tr = terminalreporter
    from harness import pytest_since
    from harness.spec.errors import SpecError

    try:
        since_root = _session_config(None).root.resolve()
    except (SpecError, OSError):
        since_root = None
    pytest_since.summary(tr, config, since_root)
    unused = sorted(getattr(config, "_golden_unused", ()))
    if unused:
        strict = config.getoption("--golden-strict-unused")
        tr.section("unused goldens")
        for path in unused:
            tr.write_line(f"{path}: no test targets this golden", red=bool(strict), yellow=not strict)
        tr.write_line(f"{len(unused)} unused golden(s): " + ("they fail the session (--golden-strict-unused)" if strict
                      else "remove them, or schedule their platform; --golden-strict-unused fails on them"))
    if not results:
        return
    tr.section("golden workloads")
    total = 0.0
    width = max([8] + [len(r["platform"] or "-") for r in results])  # a CPU-numerics variant is longer
    for r in results:
        tr.write_line(f"{r['workload']:<36} {r['platform'] or '-':<{width}} {r['status']:<10} {r['wall_s']:>7.1f}s")
        for line in (r.get("rules_applied") or [])[:20]:  # tolerance rules that changed its verdict (issue 41)
            tr.write_line(f"    {line}", yellow=True)
        total += r["wall_s"]
    tr.write_line(f"golden wall time: {total:.1f}s")
    refreshed = [r for r in results if r["status"] == "refreshed" and r.get("changes")]
    if refreshed:
        tr.section("golden refresh: what changed (review before committing)")
        for r in refreshed:
            for line in r["changes"].rstrip().splitlines():
                tr.write_line(line)
    created = [r for r in results if r["status"] == "created"]
    if created:
        tr.write_line(f"{len(created)} golden(s) created by --golden-capture-missing: review and commit them "
                      f"({', '.join(r['workload'] + '/' + (r['platform'] or '-') for r in created)})")
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
