"""`PolicyEngine.hf_state_dict(on_device=True)`: the refit source for CUDA IPC staging.

On a GPU the on-device path keeps the weights on the device (no host copy, no
pickled tensors); here it runs over gloo, where the same code moves the shards
point-to-point (`send`/`recv`), and must assemble exactly the tensors of the
default (host copy + `gather_object`) path. In a 1-rank world it must not copy
at all: its tensors are the parameters' own storage.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.spec import load_spec
from suites.local_world import spawn_world, with_layout

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _spec(**layout):
    spec = load_spec(str(REPO / "goldens/qwen3_moe_tiny_tp2pp2cp2ep2/workload.yaml"))
    return with_layout(spec, **{**dict(tp=1, pp=1, cp=1, ep=1, etp=1, dp=1, pp_layout=None), **layout})


def _both(engine) -> dict:
    """Both exports after one parameter change (so no export can be the initial weights by accident)."""
    with torch.no_grad():
        for i, (_, p) in enumerate(engine.named):
            p.add_(0.001 * (i + 1) * (engine.rank + 1))
    host = engine.hf_state_dict()
    device = engine.hf_state_dict(on_device=True)
    params = {p.data_ptr() for _, p in engine.named}
    aliased = sum(t.data_ptr() in params for t in device.values())
    return {"host": host, "device": device, "aliased": aliased, "order": list(device)}


@pytest.mark.parametrize("layout", [dict(), dict(tp=2)], ids=["1rank", "tp2"])
def test_on_device_export_equals_the_host_export(layout):
    results = spawn_world(_spec(**layout), _both)
    rank0 = results[0]
    assert rank0["host"], "rank 0 assembles the full weights"
    assert rank0["order"] == list(rank0["host"]), "same names, same (reference model) order"
    for name, want in rank0["host"].items():
        got = rank0["device"][name]
        assert got.dtype == want.dtype and torch.equal(got, want), name
    for other in results[1:]:
        assert other["host"] == {} and other["device"] == {}
    if not layout:  # one rank: the parameters themselves, no copy
        assert rank0["aliased"] == len(rank0["device"])


def test_megatron_on_device_export_equals_the_host_export():
    """The megatron backend's 1-rank on-device export (its CUDA IPC refit source) vs its host export."""
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    (rank0,) = spawn_world(_spec(backend="megatron"), _both)
    assert rank0["order"] == list(rank0["host"]) and rank0["host"]
    for name, want in rank0["host"].items():
        assert torch.equal(rank0["device"][name], want), name


def _bf16_steps(engine, batch) -> dict:
    before = {n: p.detach().clone() for n, p in engine.named}
    metrics = [engine.train(batch) for _ in range(2)]
    opt = engine.optimizer
    return {"optimizer": type(opt).__name__, "param_dtypes": {p.dtype for _, p in engine.named},
            "master_dtypes": {m.dtype for m in opt.master},
            "moment_dtypes": {s["exp_avg"].dtype for s in opt.state.values()},
            "rounded": all(torch.equal(p.detach(), m.detach().to(p.dtype))
                           for (_, p), m in zip(engine.named, opt.master)),
            "moved": sum(not torch.equal(before[n], p.detach()) for n, p in engine.named),
            "loss_finite": all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)}


def test_a_bf16_native_policy_trains_on_fp32_masters():
    from harness.policy.synthetic import synthetic_batch

    spec = _spec()
    spec["model"] = {**spec["model"], "dtype": "bfloat16"}
    (got,) = spawn_world(spec, _bf16_steps, synthetic_batch(spec, 4, seed=0))
    assert got["optimizer"] == "MasterWeightsAdamW"
    assert got["param_dtypes"] == {torch.bfloat16}
    assert got["master_dtypes"] == got["moment_dtypes"] == {torch.float32}
    assert got["rounded"] and got["moved"] > 0 and got["loss_finite"]
