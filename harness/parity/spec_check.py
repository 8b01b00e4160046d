"""The spec first: does the run's workload spec match the golden's? (gate half: standard library only)

Where the two specs live:

* the run: ``run.json`` holds the loaded spec (``spec``) and its ``spec_digest``; the
  run's manifest repeats the digest (``workload.spec_digest``);
* the golden: its ``manifest.json`` holds the digest of the spec it was captured from
  (``workload.spec_digest``); a golden stored by this harness version or later also
  holds that spec itself (``PROVENANCE.json`` ``spec``), so the fields that changed can
  be named. An older golden has the digest only: the difference is still found, named
  by digest.

A spec difference is the first finding of every report (``Verdict.spec``): a changed
seed is named as ``seed: 1234 -> 1235``, not inferred from the operator counts and
"STALE?" lines that follow from it. It *gates* (a failing verdict of its own, decided
before the run: ``golden check`` and the pytest plugin refuse it before Ray starts) when
a field the golden's spec has was changed or removed. It is informational, and the run
goes on to compare the surfaces, when it cannot be a change the user made: a field the
golden's spec lacks (a schema default added since the capture), or a golden that
records only the digest (which a new schema default changes too).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ABSENT", "SpecDifference", "before_run", "compare_specs", "golden_spec", "run_against_golden",
           "spec_changes"]

ABSENT = "(absent)"
SHOWN_IN_HEADLINE = 4
# Fields that do not change what a run on one platform does: prose, and the list of platforms the
# workload is scheduled on (a consumer drops "cuda" from it after a CPU capture; its golden holds).
NOT_RUN_FIELDS = ("description", "platform.platforms")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def spec_changes(golden: Mapping[str, Any], run: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``"field.path: golden -> run"`` for every leaf field that differs (dotted paths, sorted;
    a field only one side has shows :data:`ABSENT` on the other). Both are loaded specs
    (defaults filled in, numbers normalised by ``load_spec``), so equal values compare equal."""
    out: list[str] = []
    for key in sorted(set(golden) | set(run), key=str):
        path = f"{prefix}{key}"
        if key not in golden:
            out.append(f"{path}: {ABSENT} -> {_text(run[key])}")
        elif key not in run:
            out.append(f"{path}: {_text(golden[key])} -> {ABSENT}")
        elif isinstance(golden[key], Mapping) and isinstance(run[key], Mapping):
            out += spec_changes(golden[key], run[key], path + ".")
        elif golden[key] != run[key] or type(golden[key]) is not type(run[key]):
            out.append(f"{path}: {_text(golden[key])} -> {_text(run[key])}")
    return out


@dataclass(frozen=True)
class SpecDifference:
    """The run's spec is not the golden's. ``changes``: one line per differing field (empty when
    the golden records only its digest)."""

    golden_digest: str
    run_digest: str
    changes: tuple[str, ...] = ()

    @property
    def gating(self) -> bool:
        """Whether a field the golden's spec has was changed or removed (a failing verdict);
        False for a digest-only golden or fields new since the capture (informational)."""
        return any(f": {ABSENT} -> " not in line for line in self.changes)

    @property
    def status(self) -> str:
        return "fail" if self.gating else "info"

    @property
    def headline(self) -> str:
        """One line: ``spec: the workload spec differs from the golden's: seed: 1234 -> 1235``."""
        if not self.changes:
            return (f"spec: the workload spec differs from the golden's (spec_digest {self.golden_digest[:12]} -> "
                    f"{self.run_digest[:12]}); the golden records only the digest of its spec, so the fields "
                    "cannot be named and a schema default added since its capture looks the same: not gated "
                    "(a refresh records the spec)")
        shown = "; ".join(self.changes[:SHOWN_IN_HEADLINE])
        more = f"; and {len(self.changes) - SHOWN_IN_HEADLINE} more" if len(self.changes) > SHOWN_IN_HEADLINE else ""
        return f"spec: the workload spec differs from the golden's: {shown}{more}"

    def lines(self) -> list[str]:
        """The headline, then every changed field on a line of its own (golden -> this run)."""
        out = [self.headline]
        if self.changes:
            out.append(f"  {len(self.changes)} field(s) differ (golden -> this run):")
            out += [f"    {line}" for line in self.changes]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "gating": self.gating, "golden_digest": self.golden_digest,
                "run_digest": self.run_digest, "changes": list(self.changes), "headline": self.headline}


def compare_specs(golden_digest: str | None, golden_spec: Mapping[str, Any] | None, run_digest: str | None,
                  run_spec: Mapping[str, Any] | None) -> SpecDifference | None:
    """The difference between the golden's spec and the run's, or None when they are the same
    or either digest is unknown (nothing to compare: never a finding made up)."""
    if not golden_digest or not run_digest or golden_digest == run_digest:
        return None
    changes: tuple[str, ...] = ()
    if isinstance(golden_spec, Mapping) and isinstance(run_spec, Mapping):
        changes = tuple(line for line in spec_changes(golden_spec, run_spec)
                        if line.split(": ", 1)[0] not in NOT_RUN_FIELDS)
        if not changes:
            return None  # only prose or scheduling differ: the same run
    return SpecDifference(golden_digest=golden_digest, run_digest=run_digest, changes=changes)


def golden_spec(manifest: Mapping[str, Any] | None,
                provenance: Mapping[str, Any] | None) -> tuple[str | None, dict | None]:
    """``(spec_digest, spec)`` a golden records: the digest from its manifest, the spec from its
    provenance (None for a golden stored before goldens recorded it)."""
    workload = (manifest or {}).get("workload")
    digest = workload.get("spec_digest") if isinstance(workload, Mapping) else None
    spec = (provenance or {}).get("spec")
    return (digest if isinstance(digest, str) else None), (dict(spec) if isinstance(spec, Mapping) else None)


def run_against_golden(run_manifest: Mapping[str, Any], run_spec: Mapping[str, Any] | None,
                       golden_manifest: Mapping[str, Any], golden_provenance: Mapping[str, Any] | None
                       ) -> SpecDifference | None:
    """A finished run (its manifest's ``workload.spec_digest``; ``run.json``'s ``spec`` when there
    is one) against a stored golden."""
    run_digest, _ = golden_spec(run_manifest, None)
    digest, spec = golden_spec(golden_manifest, golden_provenance)
    return compare_specs(digest, spec, run_digest, run_spec)


def before_run(spec: Mapping[str, Any], digest: str, golden_manifest: Mapping[str, Any],
               golden_provenance: Mapping[str, Any] | None) -> SpecDifference | None:
    """The spec a run would use (loaded, and its ``spec_digest``, as the run records them) against
    a stored golden, before anything starts."""
    golden_digest, golden = golden_spec(golden_manifest, golden_provenance)
    return compare_specs(golden_digest, golden, digest, spec)
