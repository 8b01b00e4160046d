"""A cold run forks its workers from a zygote of its own, and its surfaces are the golden's.

``golden check`` (no warm runtime) starts a private Ray instance and, beside it, a fork
server (``harness.runner.zygote``) that imports torch once; the run's policy, rollout
and data-plane workers fork from it (``Session._start_zygote``) instead of each
importing torch. This runs the smoke golden cold, as the CLI does, and checks:

* the policy and rollout workers were children of a zygote while they ran;
* every gated surface file is byte-identical to the stored golden (captured from
  fresh interpreters), so a forked cold run is what a fresh one is;
* the zygote is gone once the run is over, and the warm-runtime rewrite with it.

``cold_zygote_reason`` names why a cold run must start fresh interpreters instead
(checked without running anything).
"""

from __future__ import annotations

import pytest

from harness.pytest_plugin import GATED_SURFACES
from harness.runner.warm import cold_zygote_reason
from harness.spec import load_spec
from harness.spec.typed import as_workload
from suites.stored_goldens import stored_dir

SMOKE = "qwen3_moe_tiny_smoke"


class ParentRecorder:
    """Progress sink: each reported worker's pid and its parent's command line, read while it runs."""

    def __init__(self) -> None:
        self.parents: dict[str, list[str]] = {}

    def __call__(self, text: str) -> None:
        pass

    def detail(self, what: str, records: list[dict]) -> None:
        self.parents[what] = [_parent_cmdline(r.get("pid", r.get("actor_pid"))) for r in records]


def _parent_cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{ppid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode()


def test_cold_zygote_reasons(monkeypatch):
    monkeypatch.delenv("GOLDEN_WORKER_ENV", raising=False)
    spec = load_spec(SMOKE)
    assert cold_zygote_reason(spec, None, environ={}) is None
    assert "GOLDEN_ZYGOTE=0" in cold_zygote_reason(spec, None, environ={"GOLDEN_ZYGOTE": "0"})
    assert "cluster" in cold_zygote_reason(spec, "10.0.0.1:6379", environ={})
    cuda = as_workload({**spec.to_dict(), "platform": {**spec.to_dict()["platform"], "device": "cuda"}})
    assert "cuda" in cold_zygote_reason(cuda, None, environ={})
    assert "GOLDEN_WORKER_ENV" in cold_zygote_reason(spec, None, environ={"GOLDEN_WORKER_ENV": "auto"})


@pytest.mark.slow
def test_a_cold_run_forks_from_its_zygote_and_equals_the_golden(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    from harness import flows
    from harness.workerenv import select

    monkeypatch.delenv("GOLDEN_ZYGOTE", raising=False)
    rec = ParentRecorder()
    execution = flows.execute(SMOKE, run_dir=tmp_path / "run", say=rec, platform="cpu")  # cold, as golden check
    assert execution.ok, execution.problems()
    for what in ("policy workers", "rollout workers"):
        assert rec.parents[what] and all("harness.runner.zygote" in p for p in rec.parents[what]), rec.parents
    golden = stored_dir(SMOKE) / "surfaces"
    moved = [s for s in GATED_SURFACES
             if (execution.run_dir / "surfaces" / f"{s}.json").read_bytes() != (golden / f"{s}.json").read_bytes()]
    assert not moved, f"gated surfaces {moved} of a cold run forked from its zygote differ from the golden"
    assert select._warm_runtime_env is None  # the run's rewrite went with its zygote
