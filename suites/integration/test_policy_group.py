"""PolicyGroup over Ray: the 8-rank TP2xPP2xCP2 EP2 world and a 1-rank world.

One Ray session for the module; each world is started once and all checks
run inside it. Parity with the 1-rank run as in test_parallel_parity (rel 1e-5,
Adam eps 1e-6 for the reason given there).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from harness.policy.synthetic import synthetic_batch
from harness.spec import load_spec
from harness.spec.topology import plan
from harness.spec.typed import as_workload
from suites.local_world import with_layout

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

STEPS = 3
REL = 1e-5


def _spec(**layout):
    spec = load_spec(str(REPO / "goldens/qwen3_moe_tiny_tp2pp2cp2ep2/workload.yaml"))
    spec = with_layout(spec, **layout)
    spec["policy"]["optimizer"] = {**spec["policy"]["optimizer"], "eps": 1e-6}
    spec["plugins"] = {**spec["plugins"], "policy_profiler": None}
    spec["rollout"] = {**spec["rollout"], "tp": 1, "engines": 1}  # fits a 1-rank colocated policy
    return spec


@pytest.fixture(scope="module")
def ray_session():
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _drive(group, batch, tmp):
    """Monolithic steps, checksums, logprobs; then split steps from the saved start."""
    group.save_checkpoint(str(tmp / "start"))
    mono = [group.train(batch) for _ in range(STEPS)]
    sums = group.parameter_checksums()
    logprobs = group.get_logprobs(batch)
    ref_logprobs = group.get_reference_logprobs(batch)
    group.load_checkpoint(str(tmp / "start"))
    split = []
    for _ in range(STEPS):
        group.begin_train_step()
        group.train_microbatch({k: v[:4] for k, v in batch.items()})
        group.train_microbatch({k: v[4:] for k, v in batch.items()})
        split.append(group.finish_train_step())
    return mono, split, sums, logprobs, ref_logprobs


def _close(a, b):
    return abs(a - b) <= REL * max(abs(a), 1e-12)


@pytest.fixture(scope="module")
def single(ray_session, tmp_path_factory):
    from harness.policy.group import PolicyGroup

    spec = _spec(tp=1, pp=1, cp=1, ep=1, dp=1)
    batch = synthetic_batch(spec, 8, seed=0)
    tmp = tmp_path_factory.mktemp("single")
    group = PolicyGroup(as_workload(spec), plan(spec), str(tmp))
    try:
        out = _drive(group, batch, tmp)
        # split-API misuse through the actors raises the documented errors
        with pytest.raises(RuntimeError, match="no train step open"):
            group.finish_train_step()
        group.abort_train_step()
        group.abort_train_step()  # idempotent
        group.begin_train_step()
        with pytest.raises(RuntimeError, match="a train step is already open"):
            group.begin_train_step()
        group.abort_train_step()
    finally:
        group.shutdown()
    return batch, out


def test_single_rank_trains_and_split_matches(single):
    batch, (mono, split, _sums, logprobs, ref_logprobs) = single
    assert mono[0]["loss"] != mono[-1]["loss"]
    for m, s in zip(mono, split):
        assert _close(m["loss"], s["loss"]) and _close(m["grad_norm"], s["grad_norm"])
    # reference logprobs are the initial policy's, which the batch carries
    torch.testing.assert_close(ref_logprobs, batch["reference_policy_logprobs"], rtol=0, atol=1e-5)
    assert not torch.allclose(logprobs, ref_logprobs, atol=1e-4)


def test_eight_rank_world_matches_single_rank(single, tmp_path):
    from harness.policy.group import PolicyGroup

    batch, (mono1, _, sums1, logprobs1, _) = single
    spec = _spec(tp=2, pp=2, cp=2, ep=2, dp=1)
    group = PolicyGroup(as_workload(spec), plan(spec), str(tmp_path))
    try:
        mono, split, sums, logprobs, ref_logprobs = _drive(group, batch, tmp_path)
    finally:
        group.shutdown()
    for i in range(STEPS):
        for key in ("loss", "grad_norm"):
            assert _close(mono1[i][key], mono[i][key]), (i, key, mono1[i][key], mono[i][key])
            assert _close(mono1[i][key], split[i][key]), (i, key, mono1[i][key], split[i][key])
    for name, (s, sq, sabs) in sums1.items():
        assert abs(s - sums[name][0]) <= REL * sabs, name
        assert _close(sq, sums[name][1]), name
    torch.testing.assert_close(logprobs, logprobs1, rtol=0, atol=1e-4)
    torch.testing.assert_close(ref_logprobs, batch["reference_policy_logprobs"], rtol=0, atol=1e-5)


def test_invalid_topology_refused_before_any_actor(ray_session, tmp_path, monkeypatch):
    import harness.policy.group as group_module
    from harness.policy.group import PolicyGroup

    # The workers are anonymous actors (name=None), so Ray's named-actor list cannot show one
    # being started. A sentinel in place of the actor class records any start instead (it
    # stands in only to prove that none happens, as no_run does in test_cli_workload).
    started = []

    class NoActor:
        @staticmethod
        def options(**kwargs):
            started.append(kwargs)
            raise AssertionError("a policy worker actor was started for an invalid layout")

    monkeypatch.setattr(group_module, "PolicyWorker", NoActor)
    spec = _spec(tp=1, pp=1, cp=1, ep=1, dp=1, etp=2)
    with pytest.raises(ValueError, match="etp"):
        plan(spec)  # the plan refuses it: no group is ever built from it
    bad_kv = _spec(tp=4, pp=1, cp=1, ep=1, dp=1)
    bad_kv["model"] = {**bad_kv["model"], "kv_heads": 2}
    with pytest.raises(ValueError, match="kv_heads"):
        plan(bad_kv)
    with pytest.raises(ValueError, match="topology has no policy layout"):  # a group needs the run's plan
        PolicyGroup(as_workload(_spec(tp=1, pp=1, cp=1, ep=1, dp=1)), None, str(tmp_path))
    assert started == []
