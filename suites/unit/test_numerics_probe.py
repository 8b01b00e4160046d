"""The numerics probe (harness.policy.numerics_probe, harness.taps) on the real native stage model.

A 1-rank gloo world (in-process: a HashStore) holds a ParallelQwen3Moe; one forward and
backward runs with and without the probe. Checked: the digests are sha256 of the tensor bytes
(also for strided and bf16 tensors), the probe changes no bit of the loss or the gradients,
adds no operator (the operators surface must not move), and names every tapped module.
"""

from __future__ import annotations

import hashlib

import pytest
import torch
import torch.distributed as dist

from harness import taps
from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.parallel.groups import ProcessGroups, layout_from_spec
from harness.policy.native.parallel_model import ParallelQwen3Moe
from harness.policy.numerics_probe import NumericsProbe, digest
from harness.spec.typed import as_workload


@pytest.fixture(scope="module")
def model():
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    spec = as_workload({"model": {**ModelConfig().to_dict(), "layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2,
                                  "head_dim": 8, "experts": 4, "top_k": 2, "moe_intermediate": 16, "vocab": 64},
                        "policy": {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "dp": 1, "seq_len": 16}})
    cfg = ModelConfig.from_spec(spec.model)
    groups = ProcessGroups.create(layout_from_spec(spec.policy), 0)
    full = build_reference_model(cfg, 7).state_dict()
    yield ParallelQwen3Moe(cfg, groups, range(cfg.layers), full, seq_len=16, is_first=True, is_last=True)
    taps.install(None)


def _step(m: ParallelQwen3Moe) -> tuple[torch.Tensor, list[torch.Tensor]]:
    m.zero_grad(set_to_none=True)
    ids = torch.arange(32).reshape(2, 16) % 64
    out = m(ids, None)
    out.sum().backward()
    return out.detach().clone(), [p.grad.clone() for _, p in m.hf_named_parameters()]


def _probed_step(m: ParallelQwen3Moe, depth: str) -> NumericsProbe:
    """A probe of ``depth`` installed around one train step of ``m`` (then uninstalled)."""
    probe = NumericsProbe(depth, {}, "native")
    probe.install()
    try:
        probe.begin_step()
        _step(m)
    finally:
        probe.uninstall()
    return probe


def _op_counts(fn) -> dict[str, int]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key: e.count for e in prof.key_averages()}


def test_digest_is_sha256_of_the_bytes_strided_and_bf16():
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert digest(t) == hashlib.sha256(t.numpy().tobytes()).hexdigest()
    view = t.t()[1:, ::2]   # non-contiguous, offset
    assert digest(view) == hashlib.sha256(view.contiguous().numpy().tobytes()).hexdigest()
    b = torch.randn(5, 3).to(torch.bfloat16).t()
    assert digest(b) == hashlib.sha256(b.contiguous().view(torch.int16).numpy().tobytes()).hexdigest()
    bumped = t.clone()
    bumped[0, 0] = torch.nextafter(bumped[0, 0], torch.tensor(1.0))   # one ulp: another digest
    assert digest(bumped) != digest(t)


def test_digest_dispatches_no_operator():
    t = torch.randn(6, 4, requires_grad=True)
    strided = (t * 2).t()
    counts = _op_counts(lambda: digest(strided))
    assert not [k for k in counts if k.startswith("aten::")], counts


def test_probe_changes_no_bit_and_adds_no_operator(model):
    taps.install(None)
    base_out, base_grads = _step(model)
    base_ops = _op_counts(lambda: _step(model))
    probe = NumericsProbe("modules", {"tp": 0, "pp": 0}, "native")
    probe.install()
    try:
        probe.begin_step()
        out, grads = _step(model)
        probe.recording = False
        probe.begin_step()
        ops = _op_counts(lambda: _step(model))
    finally:
        probe.uninstall()
    assert torch.equal(out, base_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, base_grads))
    assert ops == base_ops
    keys = set(probe.entries)
    for name in ("model.embed_tokens", "model.rotary_emb", "model.layers.1.self_attn.attention",
                 "model.layers.1.mlp.gate", "model.layers.1.mlp.experts.3", "model.layers.0.mlp", "lm_head"):
        assert f"step0002/forward/mb000/{name}#0" in keys, name
    assert "step0002/backward/mb000/model.layers.0.self_attn.q_proj#0" in keys
    rec = probe.entries["step0002/forward/mb000/model.layers.0.self_attn.attention#0"]
    assert rec["inputs"] == ["model.layers.0.self_attn.rotary", "model.layers.0.self_attn.v_proj"]


def test_depth_blocks_records_blocks_only(model):
    probe = _probed_step(model, "blocks")
    names = {k.split("/", 3)[3].split("#")[0] for k in probe.entries}
    assert "model.layers.0.mlp" in names and "model.layers.0.self_attn" in names
    assert not any(n.endswith(("q_proj", "mlp.gate", "attention")) for n in names), names


def test_no_probe_no_record_outside_a_step(model):
    probe = NumericsProbe("modules", {}, "native")
    probe.install()
    try:
        _step(model)   # not in a train step (logprobs, rollouts): nothing recorded
    finally:
        probe.uninstall()
    assert probe.entries == {}


def test_a_tensor_named_twice_is_hashed_once_and_both_names_recorded(model, monkeypatch):
    # a layer's self_attn block returns its o_proj's output: one tensor, two names, in forward
    # and (the gradient arriving at it) in backward; hashing it twice was a third of the cost
    from harness.policy import numerics_probe

    hashed: list[torch.Tensor] = []
    real = numerics_probe.digest

    def counting(t):
        hashed.append(t)   # kept alive: an id is never reused while the test looks
        return real(t)

    monkeypatch.setattr(numerics_probe, "digest", counting)
    probe = _probed_step(model, "modules")
    for phase in ("forward", "backward"):
        a = probe.entries[f"step0001/{phase}/mb000/model.layers.0.self_attn#0"]
        b = probe.entries[f"step0001/{phase}/mb000/model.layers.0.self_attn.o_proj#0"]
        assert a["sha256"] == b["sha256"] and b["seq"] < a["seq"]
    twice = [t for i, t in enumerate(hashed) if any(t is u for u in hashed[:i])]
    assert not twice, f"{len(twice)} tensors hashed more than once"


def test_a_collective_is_recorded_after_its_wait_by_group_phase_and_call(model):
    from harness.parallel.data import _all_reduce_flat

    group = dist.new_group([0], group_desc="dp_cp")

    class _Gather(torch.autograd.Function):   # a collective in backward: phase from autograd
        @staticmethod
        def forward(ctx, x):
            taps.collective("all_gather", group, x)
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            taps.collective("reduce_scatter", group, g)
            return g

    grads = [torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.ones(4)]
    taps.collective("all_gather", group, grads[1])   # no probe: nothing, no error
    blocks = NumericsProbe("blocks", {}, "native")
    blocks.install()
    blocks.begin_step()
    taps.collective("all_gather", group, grads[1])   # depth blocks: modules only
    assert blocks.entries == {}
    probe = NumericsProbe("modules", {}, "native")
    probe.install()
    try:
        taps.collective("all_gather", group, grads[1])   # outside a step: not recorded
        probe.begin_step()
        x = torch.randn(3, requires_grad=True)
        _Gather.apply(x).sum().backward()
        _all_reduce_flat(grads, group)
        _all_reduce_flat(grads, group)
        taps.collective("recv", "pp", grads[1], phase="forward", mb=3)
    finally:
        probe.uninstall()
    flat = torch.cat([g.reshape(-1) for g in grads])
    e = probe.entries
    assert sorted(e) == ["step0001/backward/mb000/collective.all_reduce.dp_cp#0",
                         "step0001/backward/mb000/collective.all_reduce.dp_cp#1",
                         "step0001/backward/mb000/collective.reduce_scatter.dp_cp#0",
                         "step0001/forward/mb000/collective.all_gather.dp_cp#0",
                         "step0001/forward/mb003/collective.recv.pp#0"]
    assert e["step0001/backward/mb000/collective.all_reduce.dp_cp#1"]["sha256"] == digest(flat)
    assert e["step0001/forward/mb000/collective.all_gather.dp_cp#0"]["sha256"] == digest(x)


def test_the_recorder_digests_the_first_and_last_step_only(tmp_path):
    import json
    from types import SimpleNamespace

    from harness.policy.numerics_probe import NumericsRecorder

    def run(block: dict) -> list[str]:
        spec = SimpleNamespace(to_dict=lambda: {"numerics": block, "grpo": {"iterations": 4}},
                               platform=SimpleNamespace(device="cpu"))
        w = torch.ones(3)
        engine = SimpleNamespace(backend="native", coords={"tp": 0}, NUMERICS_TAPS=True,
                                 named=[("w", w)], steps_done=0)
        out = tmp_path / json.dumps(block).replace('"', "").replace(" ", "")
        rec = NumericsRecorder(spec, engine, 0, out)
        try:
            for _ in range(4):
                rec.begin()
                w.add_(1.0)
                engine.steps_done += 1
                rec.finish()
        finally:
            rec.close()
        files = sorted(p.name for p in out.rglob("*.json"))
        steps = sorted({k.split("/")[0] for f in out.rglob("*.json") for k in json.loads(f.read_text())["entries"]})
        return files + steps

    assert run({}) == ["rank00000.step0001.json", "rank00000.step0004.json", "step0000", "step0001", "step0004"]
    assert run({"steps": "all"})[:4] == [f"rank00000.step000{n}.json" for n in (1, 2, 3, 4)]
