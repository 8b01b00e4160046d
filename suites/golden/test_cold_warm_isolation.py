"""Warm processes leak nothing into a workload: warm and cold runs give byte-identical gated surfaces.

The warm runtime (``harness.runner.warm``) hands the policy and rollout
processes of one workload to the next. This test runs the two cheapest CPU
goldens in both orders through the ``golden`` fixture's runtime (A, B, B, A:
each runs once right after the other one, in that one's processes; the very
first run starts the processes), and checks for each run:

* every gated surface file is byte-identical to the stored golden (a cold
  capture), and so to the other run of the same workload;
* the second workload of each order really reused processes of the first
  (the pool's counters and the workers' pids; its data-plane process too), and the first one's policy and
  rollout processes were forked by the runtime's zygote (``harness.runner.zygote``).

A planted regression (``harness.mutations.WARM_SAFE``, run warm) must leave
nothing behind: the smoke golden with ``extra_operator`` planted through the
runtime (the mutation must show: its operators surface moves), then the same
golden clean in the very processes that ran the mutation (it was undone),
byte-identical to the cold golden.

The other CPU goldens are proven warm by ``pytest -m golden`` itself: this file
sorts before ``test_goldens.py``, whose workloads then all run in processes
used before (the megatron and dtensor goldens run in fresh processes by design,
``warm.cold_reason``, forked from the same zygote after other workloads ran);
``benches/warm_isolation.py`` runs every CPU golden warm in both orders.
The cold side is the goldens, captured cold; no workload runs a second time
cold here, so the gate's time does not double. Nor warm: each run of the first
order answers its golden's surface tests in ``test_goldens.py``
(``GoldenSession.adopt_run``: it is exactly the run the ``golden`` fixture would
make, compared the same way), so those two goldens do not run again there.
"""

from __future__ import annotations

import os

import pytest

from harness import flows
from harness.pytest_plugin import GATED_SURFACES
from harness.runner.warm import ZYGOTE_ENV
from suites.stored_goldens import stored_dir
from suites.worker_pids import PidRecorder

CHEAP = ("qwen3_moe_tiny_smoke", "qwen3_moe_tiny_streaming")  # 1 and 2 policy ranks, TP1 engines
pytestmark = [pytest.mark.slow, pytest.mark.golden,
              pytest.mark.golden_uses(*CHEAP, files=("harness/mutations.py", "suites/stored_goldens.py",
                                                     "suites/worker_pids.py"))]


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _run(golden, workload: str, tmp_path_factory) -> tuple[flows.Execution, PidRecorder]:
    rec = PidRecorder()
    execution = flows.execute(workload, run_dir=tmp_path_factory.mktemp(workload) / "run", say=rec,
                              warm=golden.warm_runtime(), platform="cpu")
    assert execution.ok, execution.problems()
    return execution, rec


def _assert_golden_bytes(execution: flows.Execution, label: str) -> None:
    golden_dir = stored_dir(execution.spec["name"]) / "surfaces"
    moved = [s for s in GATED_SURFACES
             if (execution.run_dir / "surfaces" / f"{s}.json").read_bytes() != (golden_dir / f"{s}.json").read_bytes()]
    assert not moved, f"{label}: gated surfaces {moved} differ from the cold golden"


@pytest.mark.parametrize("order", [CHEAP, CHEAP[::-1]], ids=["smoke-then-streaming", "streaming-then-smoke"])
def test_warm_run_equals_cold_golden(golden, order, tmp_path_factory):
    if golden.warm_runtime() is None:
        pytest.fail("GOLDEN_WARM=0: the warm runtime is off, nothing to compare", pytrace=False)
    runtime = golden.warm_runtime()
    first, first_rec = _run(golden, order[0], tmp_path_factory)
    _assert_golden_bytes(first, f"{order[0]} in fresh processes")
    if os.environ.get(ZYGOTE_ENV, "1").strip() != "0":  # the pooled processes were forked by the zygote
        zygote_pid = runtime._zygote.proc.pid
        for what in ("policy workers", "rollout workers"):
            assert {_ppid(p) for p in first_rec.pids[what]} == {zygote_pid}, f"{what} not forked by the zygote"
    before = runtime.stats()
    second, second_rec = _run(golden, order[1], tmp_path_factory)
    after = runtime.stats()
    assert after["ray_starts"] == before["ray_starts"], "the second workload started another Ray instance"
    assert after["reused"] > before["reused"], f"{order[1]} reused no warm process: {before} -> {after}"
    assert after["dataplanes_reused"] > before["dataplanes_reused"], f"{order[1]} got a new data-plane process"
    reused_pids = set(first_rec.pids["policy workers"]) & set(second_rec.pids["policy workers"])
    assert reused_pids, f"{order[1]}'s policy ranks ran in none of {order[0]}'s processes"
    assert set(first_rec.pids["rollout workers"]) == set(second_rec.pids["rollout workers"])
    _assert_golden_bytes(second, f"{order[1]} in processes {order[0]} used before")
    for execution in (first, second):  # test_goldens.py's checks of these goldens read these runs
        golden.adopt_run(order[0] if execution is first else order[1], execution)


def test_a_mutation_run_leaves_nothing_for_the_next_workload(golden, tmp_path_factory, monkeypatch):
    if golden.warm_runtime() is None:
        pytest.fail("GOLDEN_WARM=0: the warm runtime is off, nothing to compare", pytrace=False)
    runtime = golden.warm_runtime()
    workload = CHEAP[0]
    with monkeypatch.context() as mp:
        mp.setenv("GOLDEN_WORKER_SETUP_HOOK", "harness.mutations.extra_operator")
        mutated, mutated_rec = _run(golden, workload, tmp_path_factory)
    golden_dir = stored_dir(workload) / "surfaces"
    operators = (mutated.run_dir / "surfaces" / "operators.json").read_bytes()
    assert operators != (golden_dir / "operators.json").read_bytes(), "the planted extra operator did not show"
    before = runtime.stats()
    clean, clean_rec = _run(golden, workload, tmp_path_factory)
    after = runtime.stats()
    assert after["ray_starts"] == before["ray_starts"], "the clean run started another Ray instance"
    assert before["tainted_killed"] == 0 and before["hooks_undone"] >= 2, before  # a policy and a rollout process
    for what in ("policy workers", "rollout workers"):
        assert set(mutated_rec.pids[what]) == set(clean_rec.pids[what]), f"{what}: not the mutated run's processes"
    _assert_golden_bytes(clean, f"{workload} in the processes of a mutation run")
