"""The verdicts of a golden workload that files alone decide, before anything runs.

Shared by the pytest plugin's runner (``harness.pytest_session.GoldenSession``, which runs a
workload only when :func:`before_run` decided nothing) and its prestart
(``harness.pytest_prestart.would_run``, which starts the warm runtime only when some selected
workload will run). A module of its own so that neither of those imports the other for it.
Reads specs and goldens only: no torch, no ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BeforeRun", "before_run", "capture_missing_hint"]


@dataclass(frozen=True)
class BeforeRun:
    """What :func:`before_run` decided for one workload without running it: ``decided``, the
    outcome tuple (missing, error, or a spec verdict) when no run is needed, else None and
    what the run needs (the golden compared with, the one a capture/refresh writes, the
    digest a refresh replaces, whether a missing golden is created) and ``plan``: the run's
    ``RunPlan`` (``harness.spec.runplan.build_plan`` without the runnable check, which imports
    torch: the workload file read once, for the verdicts and the run alike)."""

    platform: str | None
    decided: tuple | None = None
    store: str | None = None
    replaces: str | None = None
    create: bool = False
    plan: Any = None


def before_run(workload: str, root: Path, *, platform_opt: str | None, refresh: bool, capture_missing: bool,
               allow_dirty: bool, ray_address: str | None = None, options: tuple[str, ...] = ()) -> BeforeRun:
    """Every verdict of a golden workload decidable from files alone, in order: the spec loads,
    a capture/refresh targets a scheduled platform, the golden exists and is usable (unless
    it is to be captured), the spec equals the golden's, a store is not from a dirty tree.
    Reads specs and goldens only (no torch, no ray): ``GoldenSession`` runs a workload only
    when nothing is decided, and the prestart (``harness.pytest_prestart.would_run``) asks
    the same question before it starts the warm runtime. The spec is read and planned once
    (``build_plan(..., runnable=False)``, joining ``ray_address``): the plan comes back in
    ``BeforeRun.plan`` for the run (``flows.execute(plan=...)``), which loads nothing again."""
    from harness import flows
    from harness.parity.tolerances import ToleranceFileError
    from harness.store.atomic import GoldenStoreError, golden_digest

    platform = platform_opt
    create = False
    replaces: str | None = None  # the golden a refresh overwrites, read before the run
    try:
        from harness.spec.runplan import build_plan

        run_plan = build_plan(workload, (), platform=platform_opt, goldens_root=root, ray_address=ray_address,
                              runnable=False, options=options)
        spec = run_plan.workload
        platform = flows.platform_of(spec, platform_opt)
        if (refresh or capture_missing) and platform not in spec.platform.platforms:
            why = (f"cannot {'refresh' if refresh else 'capture'} {workload}: platform {platform!r} "
                   f"is not scheduled (platform.platforms = {list(spec.platform.platforms)})")
            return BeforeRun(platform, ("error", why, None, None))
        store = flows.stored_platform(spec, platform, root, write=True)  # capture/refresh target
        platform = flows.stored_platform(spec, platform, root)  # the golden compared with
        if refresh:
            replaces = golden_digest(root, spec.name, store)
        else:
            try:
                golden, _, deterministic = flows.load_golden(root, spec.name, platform)  # refuse before running
            except flows.GoldenMissing:
                if not capture_missing:
                    raise
                create = True
            else:
                changed = flows.spec_difference(spec, golden)
                if changed is not None and changed.gating:  # decided before Ray starts: the spec is what changed
                    from harness.parity.findings import Verdict

                    return BeforeRun(platform, ("compared", "", None,
                                                Verdict(deterministic=deterministic, surfaces={}, spec=changed)))
    except flows.GoldenMissing as exc:
        from harness.store.variants import base_platform

        hint = capture_missing_hint(workload, base_platform(platform) if platform else platform, root)
        return BeforeRun(platform, ("missing", f"{exc}\n  (or: {hint})", None, None))
    except (GoldenStoreError, ToleranceFileError) as exc:
        return BeforeRun(platform, ("error", f"golden {workload}/{platform} is unusable: {exc}", None, None))
    except Exception as exc:  # noqa: BLE001 - a bad spec becomes each surface's failure
        return BeforeRun(platform, ("error", f"workload {workload}: {type(exc).__name__}: {exc}", None, None))
    if (refresh or create) and not allow_dirty:  # refused before the run, as golden refresh does
        from harness.store.provenance import dirty_refusal, uncommitted_changes

        changes = uncommitted_changes(root)
        if changes is not None:
            return BeforeRun(platform, ("error", f"cannot store {workload}: {dirty_refusal(changes)}", None, None))
    return BeforeRun(platform, None, store, replaces, create, run_plan)


def capture_missing_hint(workload: str, platform: str | None, root: Path | None) -> str:
    """The pytest spelling of a first capture of one workload's golden (same root and platform,
    ``harness.cli.hints``)."""
    import shlex

    from harness.cli.hints import root_if_chosen

    parts = ["pytest", "-m", "golden", "-k", workload, "--golden-capture-missing"]
    if platform:
        parts += [f"--golden-platform={platform}"]
    chosen = root_if_chosen(root)
    if chosen is not None:
        parts += [f"--goldens-root={chosen}"]
    return " ".join(shlex.quote(p) for p in parts)
